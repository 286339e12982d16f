"""Export a training checkpoint for diffusers / peft.

    python scripts/export_checkpoint.py --checkpoint outputs/run/checkpoint-100 --model_root ckpts \
        --output exported/transformer [--format transformer|lora] [--dtype fp32|bf16]

``--format transformer`` (default) writes a diffusers transformer folder (``save_pretrained``, safetensors; LoRA runs
are merged into the base weights); use it as ``HunyuanVideo15Transformer3DModel.from_pretrained(output)`` or
``generate.py --checkpoint_path output``. ``--format lora`` (LoRA runs) writes the peft adapter folder. The checkpoint
may hold single-file weights (``transformer/model.safetensors``) or a sharded ``transformer_dcp/`` folder.
Library code: sage_grpo/export.py.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.dtypes import DTYPES  # noqa: E402
from sage_grpo.export import EXPORT_FORMATS, export_checkpoint  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="checkpoint-N directory (or any trained-weights location)")
    parser.add_argument("--model_root", default="./ckpts", help="base checkpoint root (for --format transformer)")
    parser.add_argument("--output", required=True, help="folder to create (must be new or empty)")
    parser.add_argument("--format", default="transformer", choices=EXPORT_FORMATS, dest="export_format")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="dtype of the saved tensors")
    parser.add_argument("--transformer_version", default=None,
                        help="base transformer version (default: the run's --pretrained_transformer_version)")
    args = parser.parse_args(argv)
    try:
        output = export_checkpoint(args.checkpoint, args.model_root, args.output, export_format=args.export_format,
                                   dtype=args.dtype, transformer_version=args.transformer_version)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.checkpoint} ({args.export_format}, {args.dtype}) to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

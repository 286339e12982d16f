"""Export a training checkpoint for diffusers / peft.

    sage-grpo-export --checkpoint outputs/run/checkpoint-100 --model_root ckpts \
        --output exported/transformer [--format transformer|lora|pipeline] [--dtype fp32|bf16]

(``python scripts/export_checkpoint.py ...`` is the same command.) ``--format transformer`` (default) writes a
diffusers transformer folder (``save_pretrained``, safetensors; LoRA runs are merged into the base weights); use it as
``HunyuanVideo15Transformer3DModel.from_pretrained(output)`` or ``generate.py --checkpoint_path output``.
``--format lora`` (LoRA runs) writes the peft adapter folder. ``--format pipeline`` writes a whole diffusers
pipeline folder (model_index.json, the trained transformer, the base components linked or copied per
``--link_components``) that ``HunyuanVideo15Pipeline.from_pretrained(output)`` (the i2v class for i2v runs) loads;
its model card shows the lines. The checkpoint may hold single-file weights (``transformer/model.safetensors``) or
a sharded ``transformer_dcp/`` folder. The output gets a model card (``README.md``); ``--push_to_hub --hub_model_id
you/name`` uploads the folder (nothing is uploaded otherwise).
Library code: sage_grpo/export/weights.py.
"""

import argparse
import sys

from sage_grpo.dtypes import DTYPES
from sage_grpo.export.model_card import CARD_FILE, push_to_hub
from sage_grpo.export.pipeline import LINK_MODES
from sage_grpo.export.weights import EXPORT_FORMATS, export_checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="checkpoint-N directory (or any trained-weights location)")
    parser.add_argument("--model_root", default="./ckpts", help="base checkpoint root (for --format transformer)")
    parser.add_argument("--output", required=True, help="folder to create (must be new or empty)")
    parser.add_argument("--format", default="transformer", choices=EXPORT_FORMATS, dest="export_format")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="dtype of the saved tensors")
    parser.add_argument("--link_components", default="symlink", choices=LINK_MODES,
                        help="--format pipeline: link the untouched base components (vae, text encoders, ...) into "
                        "--model_root (absolute symlinks) or copy them (a self-contained folder to move or upload)")
    parser.add_argument("--transformer_version", default=None,
                        help="base transformer version (default: the run's --pretrained_transformer_version)")
    parser.add_argument("--push_to_hub", action="store_true",
                        help="upload the exported folder (with its model card) to the Hugging Face Hub; off by default")
    parser.add_argument("--hub_model_id", default=None, help="Hub repository for --push_to_hub, e.g. you/my-model")
    parser.add_argument("--hub_public", action="store_true", help="create the Hub repository public (default private)")
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id (e.g. you/hunyuanvideo-sage-grpo)")
    try:
        output = export_checkpoint(args.checkpoint, args.model_root, args.output, export_format=args.export_format,
                                   dtype=args.dtype, transformer_version=args.transformer_version,
                                   link_components=args.link_components)
        print(f"exported {args.checkpoint} ({args.export_format}, {args.dtype}) to {output}, model card "
              f"{output / CARD_FILE}")
        if args.push_to_hub:
            print(f"uploaded to {push_to_hub(output, args.hub_model_id, private=not args.hub_public)}")
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0

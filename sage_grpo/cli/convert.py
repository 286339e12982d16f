"""Convert the reference's HunyuanVideo-1.5 checkpoint folders (Tencent's release layout) into this project's layout.

    sage-grpo-convert-reference --reference_root /data/HunyuanVideo-1.5/ckpts --output ckpts [--versions 480p_t2v]

(``python scripts/convert_reference_checkpoint.py ...`` is the same command.) Reads ``transformer/<version>``,
``vae``, ``text_encoder/llm``, ``text_encoder/byt5-small`` and ``text_encoder/Glyph-SDXL-v2`` of the reference root
and writes the diffusers-format folders ``download_weights.sh`` would have fetched (``transformer/<version>``,
``vae``, ``text_encoder``, ``tokenizer``, ``text_encoder_2``, ``tokenizer_2``, ``scheduler``). Folders of ``--output``
that it would write must not exist unless ``--overwrite``; anything else there (``VideoReward/``) is left alone.
Library code and the key mapping: sage_grpo/models/convert.py.
"""

import argparse
import sys

from sage_grpo.models.convert import COMPONENTS, ConversionError, convert_reference_checkpoint
from sage_grpo.safe_io import CheckpointError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reference_root", required=True,
                        help="the reference's checkpoint root (transformer/<version>, vae, text_encoder/llm, ...)")
    parser.add_argument("--output", required=True, help="checkpoint root to write in this project's layout")
    parser.add_argument("--versions", nargs="+", default=None,
                        help="transformer versions to convert (default: every folder under transformer/)")
    parser.add_argument("--components", nargs="+", default=list(COMPONENTS), choices=COMPONENTS,
                        help="components to convert")
    parser.add_argument("--glyph_dir", default=None,
                        help="Glyph-SDXL-v2 folder (default: <reference_root>/text_encoder/Glyph-SDXL-v2)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace folders of --output that the conversion writes (refused otherwise)")
    args = parser.parse_args(argv)
    try:
        output = convert_reference_checkpoint(args.reference_root, args.output, versions=args.versions,
                                              components=args.components, overwrite=args.overwrite,
                                              glyph_dir=args.glyph_dir)
    except (ConversionError, CheckpointError, OSError) as err:  # OSError: a folder transformers cannot read
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"converted {args.reference_root} into {output}; check it with: "
          f"sage-grpo-verify-weights --model_root {output}")
    return 0

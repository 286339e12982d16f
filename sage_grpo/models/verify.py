"""Check a checkpoint root against the expected layout (for ``download_weights.sh`` and humans).

    python -m sage_grpo.models.verify --model_root ckpts [--transformer_versions 480p_t2v 720p_t2v] [--reward]

Prints ``complete`` (exit 0) or every missing file (exit 1). The table is :mod:`sage_grpo.models.layout`.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION, MissingCheckpointError, check_layout, required_layouts


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Check a HunyuanVideo-1.5 checkpoint root against the layout.")
    parser.add_argument("--model_root", default="./ckpts")
    parser.add_argument("--transformer_versions", nargs="+", default=[DEFAULT_TRANSFORMER_VERSION])
    parser.add_argument("--reward", action="store_true", help="also require VideoReward/")
    args = parser.parse_args(argv)
    try:
        check_layout(Path(args.model_root), required_layouts(args.transformer_versions, reward=args.reward))
    except MissingCheckpointError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"{args.model_root}: complete ({', '.join(args.transformer_versions)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a tiny random-weight HunyuanVideo-1.5 checkpoint (same classes and layout as the real one) for CPU tests.

    python scripts/make_tiny_checkpoint.py --output ckpts [--seed 0] [--versions 480p_t2v 720p_t2v 480p_i2v]

An image-to-video version (480p_i2v, ...) adds the tiny SigLIP image encoder and its processor.

Takes a few seconds and a few MB per transformer version; a seed always gives identical files. See ckpts/README.md.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION  # noqa: E402
from sage_grpo.models.tiny import write_tiny_hunyuan  # noqa: E402


def write_tiny_reward(root: Path, seed: int) -> bool:
    """Hook: the tiny VideoReward model (``<root>/VideoReward``), written by ``sage_grpo.rewards.tiny`` if present."""
    try:
        from sage_grpo.rewards.tiny import write_tiny_video_reward
    except ImportError:
        return False
    write_tiny_video_reward(root, seed=seed)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="ckpts", help="checkpoint root to write (created if needed)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--versions", nargs="+", default=[DEFAULT_TRANSFORMER_VERSION],
                        help="transformer versions to write under transformer/")
    parser.add_argument("--no_reward", action="store_true", help="skip the tiny VideoReward model")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    root = write_tiny_hunyuan(args.output, seed=args.seed, versions=tuple(args.versions))
    reward = False if args.no_reward else write_tiny_reward(root, args.seed)
    print(f"wrote tiny checkpoint to {root} ({', '.join(args.versions)}{', VideoReward' if reward else ''}) "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

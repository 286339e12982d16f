"""Write a tiny random-weight VideoReward checkpoint in the released layout (tests and CPU demos).

    python scripts/make_tiny_reward_checkpoint.py --output ckpts

creates ``ckpts/VideoReward/`` (model_config.json, the tiny base model, checkpoint-1 in LoRA form and
checkpoint-2 as a full model.pth); see ``sage_grpo/rewards/tiny.py``. Everything is offline and deterministic.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="ckpts", help="model root; VideoReward/ is created inside")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key_layout", choices=("legacy", "current"), default="legacy",
                        help="state-dict naming: pre-4.52 transformers like the release (legacy) or current")
    args = parser.parse_args()

    from sage_grpo.rewards.tiny import write_tiny_video_reward

    reward_dir = write_tiny_video_reward(args.output, seed=args.seed, key_layout=args.key_layout)
    size = sum(p.stat().st_size for p in reward_dir.rglob("*") if p.is_file())
    print(f"wrote {reward_dir} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()

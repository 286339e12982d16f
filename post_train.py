"""SAGE-GRPO post-training of HunyuanVideo-1.5 (the ``sage-grpo-train`` command; code: sage_grpo/cli/train.py).

    python post_train.py --config configs/tiny_cpu.yaml                # CPU demo on the tiny checkpoint
    torchrun --nproc_per_node 8 post_train.py --sp_size 2 ...         # one node (see run_post_train.sh)

Every option is a flag named as in the reference implementation; ``--config file.yaml`` supplies values and flags
override them. ``--help`` lists them all.
"""

import sys

from sage_grpo.cli.train import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

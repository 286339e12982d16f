"""SAGE-GRPO post-training of HunyuanVideo-1.5.

    sage-grpo-train --config configs/tiny_cpu.yaml                      # or: python post_train.py --config ...
    torchrun --nproc_per_node 8 post_train.py --sp_size 2 ...          # one node (see run_post_train.sh)

Every option is a flag named as in the reference implementation; ``--config file.yaml`` supplies values and flags
override them. ``--help`` lists them all.
"""

import sys

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig


def main(argv=None) -> int:
    """Parse the command line, resolve the run (every check before any model loads: ``sage_grpo.startup``), train."""
    cfg = parse_cli(TrainConfig, argv, description=__doc__.strip().splitlines()[0])
    from sage_grpo.startup import resolve
    from sage_grpo.trainer import USER_ERRORS, run_training  # heavy imports only once the command line is valid

    try:
        start = resolve(cfg, set_threads=True)  # the run's plan; a CPU run's thread count is set here
        run_training(cfg, start)
    except USER_ERRORS as err:  # a bad input or file: its message says what to fix; bugs keep their traceback
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    return 0

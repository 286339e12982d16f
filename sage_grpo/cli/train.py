"""SAGE-GRPO post-training of HunyuanVideo-1.5.

    sage-grpo-train --config configs/tiny_cpu.yaml                      # or: python post_train.py --config ...
    torchrun --nproc_per_node 8 post_train.py --sp_size 2 ...          # one node (see run_post_train.sh)

Every option is a flag named as in the reference implementation; ``--config file.yaml`` supplies values and flags
override them. ``--help`` lists them all.
"""

import sys

from sage_grpo.config import TrainConfig, parse_cli


def main(argv=None) -> int:
    cfg = parse_cli(TrainConfig, argv, description=__doc__.strip().splitlines()[0])
    from sage_grpo.plan.report import check_memory_plan
    from sage_grpo.trainer import USER_ERRORS, run_training  # heavy imports only once the command line is valid

    try:
        check_memory_plan(cfg)  # on GPUs: a launch the memory plan says cannot fit stops here, before any model loads
        run_training(cfg)
    except USER_ERRORS as err:  # a bad input or file: its message says what to fix; bugs keep their traceback
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    return 0

"""SAGE-GRPO post-training of HunyuanVideo-1.5.

    sage-grpo-train --config configs/tiny_cpu.yaml                      # or: python post_train.py --config ...
    torchrun --nproc_per_node 8 post_train.py --sp_size 2 ...          # one node (see run_post_train.sh)

Every option is a flag named as in the reference implementation; ``--config file.yaml`` supplies values and flags
override them. ``--help`` lists them all.
"""

import os
import sys

from sage_grpo.config import TrainConfig, parse_cli


def apply_cpu_thread_policy(cfg: TrainConfig) -> str:
    """Decide a CPU run's torch thread count once, before any model loads; returns the line to print. A GPU run is
    left as it is (its CPU threads only feed the GPU)."""
    import torch

    from sage_grpo.models.bundle import resolve_device

    if resolve_device(cfg).type != "cpu":
        return f"CPU threads: torch's default ({torch.get_num_threads()}), a GPU run"
    env = os.environ.get("OMP_NUM_THREADS", "")
    if cfg.parallel.cpu_threads > 0:
        threads, why = cfg.parallel.cpu_threads, "--cpu_threads"
    elif env.isdigit() and int(env) > 0:
        threads, why = int(env), "OMP_NUM_THREADS"
    else:
        threads, why = 1, "the CPU default (--cpu_threads 0; more threads spin and collapse on a busy machine)"
    torch.set_num_threads(threads)
    return f"CPU threads: {threads}, from {why}"


def main(argv=None) -> int:
    cfg = parse_cli(TrainConfig, argv, description=__doc__.strip().splitlines()[0])
    from sage_grpo.config.launch_env import read_launch_env
    from sage_grpo.config.validation import check_numbers
    from sage_grpo.plan.fit import check_train_weights_fit
    from sage_grpo.plan.report import check_memory_plan
    from sage_grpo.trainer import USER_ERRORS, run_training  # heavy imports only once the command line is valid

    try:
        check_numbers(cfg)  # every number in its range before anything uses one (--cpu_threads -1)
        read_launch_env()  # torchrun's variables, before the device is chosen from LOCAL_RANK
        print(apply_cpu_thread_policy(cfg), flush=True)
        check_train_weights_fit(cfg)  # weights that cannot fit the machine, from the configs, before anything is built
        check_memory_plan(cfg)  # on GPUs: a launch the memory plan says cannot fit stops here, before any model loads
        run_training(cfg)
    except USER_ERRORS as err:  # a bad input or file: its message says what to fix; bugs keep their traceback
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    return 0

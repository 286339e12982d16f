"""A CPU run's torch thread count, decided once before any model loads (``--cpu_threads``, docs/differences.md)."""

import os

import torch

from sage_grpo.config.train.model import ParallelConfig


def cpu_thread_count(parallel: ParallelConfig) -> tuple:
    """(threads, why) of a CPU run: ``--cpu_threads``, else ``$OMP_NUM_THREADS``, else 1 (more threads spin and
    collapse on a busy machine)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if parallel.cpu_threads > 0:
        return parallel.cpu_threads, "--cpu_threads"
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    return 1, "the CPU default (--cpu_threads 0; more threads spin and collapse on a busy machine)"


def apply_cpu_thread_policy(parallel: ParallelConfig, device: torch.device) -> str:
    """Set a CPU run's torch thread count (``parallel``: the configuration's parallel section); returns the line to
    print. A GPU run is left as it is (its CPU threads only feed the GPU)."""
    if device.type != "cpu":
        return f"CPU threads: torch's default ({torch.get_num_threads()}), a GPU run"
    threads, why = cpu_thread_count(parallel)
    torch.set_num_threads(threads)
    return f"CPU threads: {threads}, from {why}"


def threads_as_found(device: torch.device) -> str:
    """The line of a run started in code (``GRPOTrainer(cfg)``), which keeps the caller's thread count."""
    if device.type != "cpu":
        return f"CPU threads: torch's default ({torch.get_num_threads()}), a GPU run"
    return f"CPU threads: {torch.get_num_threads()}, as the caller set them (a run started in code)"

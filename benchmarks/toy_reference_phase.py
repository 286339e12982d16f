"""Process CPU time of the KL reference phase per step on the toy demo, by ``--reference_batch_size``.

    OMP_NUM_THREADS=1 python benchmarks/toy_reference_phase.py --reference_batch_sizes 0 32 64 256 --steps 6

For each value: ``configs/toy_cpu.yaml`` (needs ``ckpts/toy``) trained for ``--steps`` steps in this process, rollout
media, validation and checkpoints off, and ``GRPOTrainer.reference_means`` timed with ``time.process_time`` (this
process's CPU seconds, less sensitive than wall time to other processes on a shared machine). Prints the transitions
per forward the run used, the CPU seconds of every step and their median without the first (warm-up) step, and the
largest difference of the first step's means from the first value's (batched forwards differ in the last bits).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def reference_phase(config: str, reference_batch_size: int, steps: int, output_dir: str):
    """(transitions per forward, CPU seconds per step, the first step's means) of one run."""
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.config.schema import from_dict, load_yaml
    from sage_grpo.trainer import GRPOTrainer

    values = load_yaml(config)
    values.update(seed=0, max_steps=steps, save_interval=10 ** 6, validation_interval=0, save_rollout_videos=False,
                  validate_at_step0=False, report_to=["none"], output_dir=output_dir, overwrite_output_dir=True,
                  quiet=True, reference_batch_size=reference_batch_size)
    trainer = GRPOTrainer(from_dict(TrainConfig, values, source=config))
    seconds, first_means = [], []
    inner = trainer.reference_means

    def timed(rollout, embeds):
        start = time.process_time()
        means = inner(rollout, embeds)
        seconds.append(time.process_time() - start)
        if not first_means:
            first_means.append(means.clone())
        return means

    trainer.reference_means = timed
    trainer.train()
    return trainer.reference_sampler.micro_batch_size, seconds, first_means[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs/toy_cpu.yaml"))
    parser.add_argument("--reference_batch_sizes", type=int, nargs="+", default=[0, 32, 64, 256])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    baseline = None
    with tempfile.TemporaryDirectory() as tmp:
        for value in args.reference_batch_sizes:
            used, seconds, means = reference_phase(args.config, value, args.steps, str(Path(tmp) / f"run_{value}"))
            baseline = means if baseline is None else baseline
            print(f"--reference_batch_size {value}: {used} transitions per forward; CPU s per step "
                  f"{', '.join(f'{s:.3f}' for s in seconds)}; median of steps 2-{args.steps} "
                  f"{statistics.median(seconds[1:]):.3f} s; first step's means vs the first value's: max |diff| "
                  f"{(means - baseline).abs().max().item():.2e}", flush=True)


if __name__ == "__main__":
    main()

"""What the demo learned, in numbers and a picture: reward gain, noise ratio and manifold error of a finished run.

    python scripts/demo_report.py --config configs/toy_cpu.yaml [post_train.py flags]   # the demo's run directory
    python scripts/demo_report.py --run_dir outputs/demo

Writes ``run.png`` next to ``metrics.jsonl`` (sage_grpo/cli/plot.py) and prints, from ``gathered_avg_reward_mean``:
the mean of the first and of the last ``--window`` steps, their difference (the gain), the standard deviation of the
first window's step means (the step-to-step noise) and gain / noise; and the manifold error of the rollouts over the
same windows when the reward reports one.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.plot import plot_run  # noqa: E402
from sage_grpo.tracking.run_dir import read_metrics, summarize_run  # noqa: E402


def summarize(rows, window: int = 5) -> dict:
    return summarize_run(rows, window)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", default=None, help="run directory (default: the config's --output_dir)")
    parser.add_argument("--window", type=int, default=5, help="steps averaged at the start and at the end")
    args, train_flags = parser.parse_known_args(argv)
    run_dir = args.run_dir
    if run_dir is None:
        from sage_grpo.config.train import TrainConfig
        from sage_grpo.config.schema import parse_cli

        run_dir = parse_cli(TrainConfig, train_flags).output.output_dir
    try:
        rows = read_metrics(Path(run_dir))
        summary = summarize(rows, args.window)
        picture = plot_run(run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    w = args.window
    print(f"reward (gathered_avg_reward_mean): first {w} steps {summary['first_mean']:.4f}, last {w} steps "
          f"{summary['last_mean']:.4f}, gain {summary['gain']:+.4f} = {summary['gain_over_noise']:.1f} x the "
          f"step-to-step std of the first {w} ({summary['first_step_std']:.4f})")
    if "manifold_first_mean" in summary:
        print(f"manifold error of the rollouts: first {w} steps {summary['manifold_first_mean']:.4f}, last {w} "
              f"{summary['manifold_last_mean']:.4f}, max {summary['manifold_max']:.4f}")
    print(f"{summary['steps']} steps, {summary['seconds_per_step']:.1f} s per step; picture: {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

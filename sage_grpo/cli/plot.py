"""Picture of a run: the GRPO reward and the manifold error (when the reward reports one) per step, as a PNG.

    sage-grpo plot outputs/demo            # writes outputs/demo/run.png next to metrics.jsonl
    python scripts/plot_run.py outputs/demo  # the same command

Reads only ``metrics.jsonl``; the reward is ``gathered_avg_reward_mean`` with its within-step std as a band.
"""

import argparse
import math
import sys
from pathlib import Path


from sage_grpo.tracking.plots import Panel, Series, plot_panels
from sage_grpo.tracking.run_dir import manifold_error_key, metric_value, read_metrics


def _values(rows, key, missing=math.nan):
    """The rows' finite numbers under ``key``; anything else (absent, NaN, a string: the file is read back) is
    ``missing``, a gap in the line."""
    return [value if value is not None else missing for value in (metric_value(row, key) for row in rows)]


def run_panels(rows):
    steps = [row["step"] for row in rows]
    reward = Panel("GRPO reward per step (mean over the step's videos; band: std within the step)", "reward", [
        Series("reward", steps, _values(rows, "gathered_avg_reward_mean"),
               _values(rows, "gathered_avg_reward_std", 0.0))])
    panels = [reward]
    key = manifold_error_key(rows)
    if key is not None:
        panels.append(Panel("manifold error of the rollouts (RMS distance to the nearest toy-world video)", "RMS",
                            [Series(key.replace("gathered_", "").replace("_reward_mean", ""), steps,
                                    _values(rows, key))]))
    kl_keys = [k for k in ("kl_loss",) if any(k in row for row in rows)]
    if kl_keys:
        panels.append(Panel("KL to the moving anchor (kl_loss)", "KL",
                            [Series(k, steps, _values(rows, k)) for k in kl_keys]))
    return panels


def plot_run(run_dir, output=None) -> Path:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no steps yet")
    return plot_panels(run_panels(rows), output or run_dir / "run.png", title=f"run: {run_dir}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    parser.add_argument("--output", default=None, help="PNG path (default: <run_dir>/run.png)")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.output)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


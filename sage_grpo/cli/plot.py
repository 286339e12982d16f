"""Picture of a run: the GRPO reward and the manifold error (when the reward reports one) per step, and the scored
validation (``Validation/...`` rows), as a PNG.

    sage-grpo plot outputs/demo            # writes outputs/demo/run.png next to metrics.jsonl
    python scripts/plot_run.py outputs/demo  # the same command

Reads only ``metrics.jsonl``; the reward is ``gathered_avg_reward_mean`` with its within-step std as a band, the
validation prompts' training reward (``Validation/avg``) beside it and their manifold error beside the rollouts'; the
drift proxy (``--drift_proxy``, ``--drift_guard``: the base model's denoising error of the validation samples) over its
step-0 value beside the validation manifold error over its own, with the points where the drift guard gave a notice
and raised an alarm; each held-out validation metric (``--validation_metrics``: a key the training reward does not
log), and each dimension the guard named as fallen, gets a panel of its own with those points marked.
"""

import argparse
import math
import sys
from pathlib import Path


from sage_grpo.tracking.plots import Panel, Series, plot_panels
from sage_grpo.tracking.run_dir import (manifold_error_key, metric_value, read_metrics, training_rows,
                                        validation_rows)

VALIDATION = "Validation/"
DRIFT_KEYS = tuple(VALIDATION + key for key in ("drift_proxy", "drift_proxy_ratio", "drift_guard_alarms",
                                                 "drift_guard_notices"))
FELL = "DriftGuard/"  # DriftGuard/<dimension>: the drift guard saw it fall at that validation point


def _values(rows, key, missing=math.nan):
    """The rows' finite numbers under ``key``; anything else (absent, NaN, a string: the file is read back) is
    ``missing``, a gap in the line."""
    return [value if value is not None else missing for value in (metric_value(row, key) for row in rows)]


def _validation_series(rows, key: str, name: str) -> list:
    """The validation rows' ``key`` as a list of one series (empty when no row has it)."""
    rows = [row for row in rows if key in row]
    return [Series(name, [row["step"] for row in rows], _values(rows, key))] if rows else []


def held_out_keys(rows, validation):
    """Validation scores that are not the training reward's (it logs ``gathered_<key>_reward_mean`` per step)."""
    trained = {k[len("gathered_"):-len("_reward_mean")] for row in rows for k in row
               if k.startswith("gathered_") and k.endswith("_reward_mean")}
    keys = dict.fromkeys(k for row in validation for k in row if k.startswith(VALIDATION))
    return [k for k in keys if not k.endswith("time") and k[len(VALIDATION):] not in trained and k not in DRIFT_KEYS]


def _proxy_findings(row, key: str) -> float:
    """The drift guard's notices or alarms of the proxy at a validation row: its alarms less the dimensions it named
    (each of those an alarm of its own)."""
    count = metric_value(row, VALIDATION + key) or 0.0
    return count - sum(1 for k in row if k.startswith(FELL)) if key == "drift_guard_alarms" else count


def dimension_panel(validation, key: str, held_out: bool):
    """A validation score's curve (``held_out``: a metric the training reward does not log) with the points where
    the drift guard saw it fall marked."""
    name = key[len(VALIDATION):]
    series = _validation_series(validation, key, name)
    fell = [row for row in validation if FELL + name in row and key in row]
    if fell:
        series.append(Series("fell (drift guard alarm)", [row["step"] for row in fell], [row[key] for row in fell],
                             points_only=True))
    title = f"{'held-out ' if held_out else ''}{key} of the validation prompts (mean over the prompts)"
    return Panel(title + ("; marked: the drift guard saw it fall while the reward rose" if fell else ""), name, series)


def drift_panel(validation, manifold_key: str):
    """The drift proxy over its step-0 value beside the validation manifold error over its own (when the reward
    reports one), and the points where the guard raised an alarm; None without the proxy."""
    proxy = _validation_series(validation, VALIDATION + "drift_proxy_ratio", "drift proxy")
    if not proxy:
        return None
    series = proxy
    truth = [(row["step"], row[manifold_key]) for row in validation if manifold_key in row]
    if truth and truth[0][1] > 0:
        series.append(Series("manifold error (truth)", [s for s, _ in truth],
                             [v / truth[0][1] for _, v in truth]))
    for name, key in (("drift guard notices", "drift_guard_notices"), ("drift guard alarms", "drift_guard_alarms")):
        marked = [row for row in validation if _proxy_findings(row, key) > 0 and VALIDATION + "drift_proxy_ratio" in row]
        if marked:
            series.append(Series(name, [row["step"] for row in marked],
                                 [row[VALIDATION + "drift_proxy_ratio"] for row in marked], points_only=True))
    return Panel("drift of the validation samples, each over its step-0 value (the base model's own samples)",
                 "x step 0", series)


def run_panels(rows):
    rows, validation = training_rows(rows), validation_rows(rows)
    steps = [row["step"] for row in rows]
    reward = Panel("GRPO reward per step (mean over the step's videos; band: std within the step)", "reward", [
        Series("reward", steps, _values(rows, "gathered_avg_reward_mean"),
               _values(rows, "gathered_avg_reward_std", 0.0))])
    reward.series += _validation_series(validation, VALIDATION + "avg", "validation prompts")
    panels = [reward]
    key = manifold_error_key(rows)
    if key is not None:
        name = key.replace("gathered_", "").replace("_reward_mean", "")
        panels.append(Panel("manifold error of the rollouts (RMS distance to the nearest toy-world video)", "RMS",
                            [Series(name, steps, _values(rows, key))]
                            + _validation_series(validation, VALIDATION + name, "validation")))
    drift = drift_panel(validation, VALIDATION + (name if key is not None else "manifold_error"))
    if drift is not None:
        panels.append(drift)
    kl_keys = [k for k in ("kl_loss",) if any(k in row for row in rows)]
    if kl_keys:
        panels.append(Panel("KL to the moving anchor (kl_loss)", "KL",
                            [Series(k, steps, _values(rows, k)) for k in kl_keys]))
    fallen = [VALIDATION + k[len(FELL):] for k in dict.fromkeys(k for row in validation for k in row)
              if k.startswith(FELL)]
    held_out = held_out_keys(rows, validation)
    for key in list(dict.fromkeys(held_out + fallen)):
        panels.append(dimension_panel(validation, key, key in held_out))
    return panels


def plot_run(run_dir, output=None) -> Path:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not training_rows(rows):
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


"""What a user sees of a run: the run directory, console lines, ``metrics.jsonl``, the trackers and rollout media.

Run directory (``--output_dir``)::

    run_config.yaml            resolved configuration (pass it back with --config to repeat the run)
    run_plan.json              every decision the start-up made (sage_grpo/startup/plan.py), of the latest start
    train.log                  the console lines
    metrics.jsonl              one JSON object per step: {"step": ..., metric: value, ...}, and one per validation:
                               {"step": ..., "Validation/<key>": value, ...} (validation_rows / training_rows)
    tb/                        TensorBoard scalars, tags grouped as the reference: Reward/, KL/, Time/, Train/
    wandb/, swanlog/           the wandb and SwanLab run files (--report_to wandb / swanlab; tracking/trackers.py)
    trackers.json              the tracker run ids a resumed run continues
    rl_samples/{step:07d}/group_{g}/   rollout mp4s and index_{i}_group_{g}_rewards.json (newest N steps kept)
    samples/step_{step:06d}/   validation videos
    checkpoint-{step}/         see sage_grpo/checkpoint/
    run.lock                   while a run writes here: its holder (tracking/run_lock.py)
    abandoned/                 later branches a resume from an older checkpoint moved aside (tracking/branches.py)
"""

import json
import math
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tqdm.auto import tqdm

from sage_grpo.config.validation import ConfigError
from sage_grpo.faults import fault_point
from sage_grpo.safe_io import atomic_write, check_output_outside_inputs
from sage_grpo.tracking.trackers import RUN_IDS_FILE, LoggedVideo

RUN_MARKER = "run_config.yaml"
RUN_PLAN_FILE = "run_plan.json"  # the start-up's plan (sage_grpo.startup.plan.RunPlan.as_record)


def check_run_dir(output_dir: str, *, resuming: bool, overwrite: bool, inputs: Optional[Dict] = None) -> None:
    """Refuse, before anything loads, to mix two runs in one directory, or to write inside what the run reads
    (``inputs``: {flag: path}); changes nothing on disk."""
    run_dir = Path(output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--output_dir {output_dir} is a file, not a directory; pass a directory path")
    try:
        check_output_outside_inputs(run_dir, "--output_dir", inputs or {})
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if (run_dir / RUN_MARKER).exists() and not (resuming or overwrite):
        raise ConfigError(f"--output_dir {output_dir} already holds a run ({RUN_MARKER} exists). Use a new "
                          "--output_dir, continue it with --resume_from_checkpoint latest, or pass "
                          "--overwrite_output_dir true to start over in place")


def prepare_run_dir(output_dir: str, *, resuming: bool, overwrite: bool) -> Path:
    """Create the run directory, refusing to mix two runs in one directory; with ``overwrite`` (and no resume) the
    earlier run's files are deleted here, so call it only once the new run is ready to write."""
    check_run_dir(output_dir, resuming=resuming, overwrite=overwrite)
    run_dir = Path(output_dir)
    if overwrite and not resuming and (run_dir / RUN_MARKER).exists():
        _remove_previous_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def overwrite_targets(run_dir: Path) -> List[Path]:
    """What ``--overwrite_output_dir`` deletes of an earlier run in ``run_dir`` (what a run writes; anything else
    there stays): its files and folders that exist."""
    files = [run_dir / name for name in (RUN_MARKER, RUN_PLAN_FILE, "train.log", "metrics.jsonl", "config_changes.yaml",
                                         RUN_IDS_FILE) if (run_dir / name).is_file()]
    folders = [path for path in sorted(run_dir.iterdir()) if path.is_dir() and not path.is_symlink()
               and (path.name in ("tb", "wandb", "swanlog", "logs", "rl_samples", "samples", "abandoned")
                    or path.name.startswith(("checkpoint-", ".checkpoint-")))] if run_dir.is_dir() else []
    return files + folders


def _remove_previous_run(run_dir: Path) -> None:
    """--overwrite_output_dir: delete what an earlier run wrote, so logs and checkpoints never mix two runs."""
    for path in overwrite_targets(run_dir):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def tensorboard_tag(name: str) -> str:
    """The reference's tag routing: reward -> Reward/, kl -> KL/, time -> Time/, everything else -> Train/; a name
    that carries its group already (``Validation/avg``) stays as it is."""
    if "/" in name:
        return name
    lowered = name.lower()
    for key, group in (("reward", "Reward"), ("kl", "KL"), ("time", "Time")):
        if key in lowered:
            return f"{group}/{name}"
    return f"Train/{name}"


def show_progress_bars(is_main: bool, quiet: bool, stream=None) -> bool:
    """tqdm bars only on the main process, on a terminal (stderr), without ``--quiet``: in a piped log a bar's
    carriage-return redraws would run into the log lines."""
    stream = sys.stderr if stream is None else stream
    return is_main and not quiet and stream.isatty()


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``12s``."""
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def eta_text(done: int, total: int, elapsed: float) -> str:
    """``eta 3m05s`` for ``total - done`` more units at the mean pace of the ``done`` ones so far ("" before any)."""
    return f"eta {format_duration(elapsed / done * (total - done))}" if done > 0 else ""


def console_line(step: int, metrics: Dict[str, float]) -> str:
    """The few numbers a person watches: step, GRPO reward mean ± std, KL, β, loss, seconds per step (each only when
    logged). Every metric goes to ``metrics.jsonl`` and TensorBoard."""
    parts = [f"step {step}"]
    if "gathered_avg_reward_mean" in metrics:
        spread = metrics.get("gathered_avg_reward_std", 0.0)
        parts.append(f"reward {metrics['gathered_avg_reward_mean']:.4f} ± {spread:.4f}")
    for key, label in (("kl_loss", "kl"), ("KL_weight", "β"), ("total_loss", "loss")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3g}")
    if "failed_reward_count" in metrics and metrics["failed_reward_count"] > 0:
        parts.append(f"failed rewards {metrics['failed_reward_count']:.0f}")
    seconds = sum(metrics.get(key, 0.0) for key in PHASE_TIMES)
    if seconds > 0:
        parts.append(f"{seconds:.1f} s/step")
    return " | ".join(parts)


class MetricsLogger:
    """Console + train.log + metrics.jsonl, always, and the trackers of ``--report_to`` (started by
    :func:`sage_grpo.tracking.trackers.start_trackers`); only the main process writes."""

    def __init__(self, run_dir: Path, *, enabled: bool = True, log_interval: int = 1, trackers: Sequence = (),
                 max_steps: Optional[int] = None):
        """``max_steps``: the console lines of :meth:`log_step` end with an ETA to it, paced on the steps logged by
        this process (the first one's start is ``now`` minus its phase times)."""
        self.enabled, self.log_interval = enabled, log_interval
        self.run_dir = run_dir
        self.trackers = list(trackers)
        self.max_steps = max_steps
        self._clock: Optional[tuple] = None  # (time, step) the ETA counts from

    def info_lines(self, messages: Sequence[str]) -> None:
        for message in messages:
            self.info(message)

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
        tqdm.write(line, file=sys.stdout)  # clears and redraws an active bar around the line instead of breaking it
        sys.stdout.flush()
        with open(self.run_dir / "train.log", "a") as handle:
            handle.write(line + "\n")

    def log_step(self, step: int, metrics: Dict[str, float], *, console: Optional[bool] = None) -> None:
        """Record the metrics of global step ``step`` (1-based, as the reference's TensorBoard x axis)."""
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        line = json.dumps({"step": step, **clean}) + "\n"
        with open(self.run_dir / "metrics.jsonl", "a") as handle:
            handle.write(line[:len(line) // 2])
            handle.flush()
            fault_point("metrics", step)  # tests: a kill here leaves a torn last line, as a real crash can
            handle.write(line[len(line) // 2:])
        tagged = {tensorboard_tag(name): value for name, value in clean.items()}
        for tracker in self.trackers:
            tracker.log_scalars(tagged, step)
        now = time.perf_counter()
        if self._clock is None:  # the first step logged here (a start or a resume) started its phase times ago
            self._clock = (now - sum(clean.get(key, 0.0) for key in PHASE_TIMES), step - 1)
        if console if console is not None else step % self.log_interval == 0:
            started, first = self._clock
            eta = eta_text(step - first, self.max_steps - first, now - started) if self.max_steps else ""
            self.info(console_line(step, clean) + (f" | {eta}" if eta else ""))

    def log_validation(self, step: int, metrics: Dict[str, float]) -> None:
        """A validation's ``Validation/...`` metrics at global step ``step`` (0: before training): a row of their own
        in ``metrics.jsonl``, the trackers' scalars under their own names, and one console line."""
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with open(self.run_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")
        for tracker in self.trackers:
            tracker.log_scalars({tensorboard_tag(name): value for name, value in row.items() if name != "step"}, step)
        self.info(validation_line(step, row))

    def log_videos(self, key: str, videos: List[LoggedVideo], step: int) -> None:
        """Videos the run wrote (rollouts, validation), as media of global step ``step``."""
        if self.enabled and videos:
            for tracker in self.trackers:
                tracker.log_videos(key, videos, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []


def validation_line(step: int, metrics: Dict[str, float]) -> str:
    """``validation at step 25 | avg 0.6123 | toy_large 0.6123 | clipscore 0.3012 | 1.2 s``: every score, no times."""
    prefix = "Validation/"
    scores = [f"{key[len(prefix):]} {value:.4g}" for key, value in metrics.items()
              if key.startswith(prefix) and not key.endswith("time")]
    return " | ".join([f"validation at step {step}", *scores, f"{metrics.get(prefix + 'time', 0.0):.1f} s"])


def is_validation_row(row: dict) -> bool:
    return any(key.startswith("Validation/") for key in row)


def training_rows(rows: list) -> list:
    """The rows of training steps (``read_metrics`` gives the validation rows too)."""
    return [row for row in rows if not is_validation_row(row)]


def validation_rows(rows: list) -> list:
    return [row for row in rows if is_validation_row(row)]


def read_metrics(run_dir: Path) -> list:
    """All rows of ``metrics.jsonl`` (for plots and tests). A line that is not a JSON object with a step number (a
    kill mid-write leaves a torn last line; the file is read back, so a line may be anything: nested thousands deep,
    a number of thousands of digits) is dropped with a warning. Read a row's values with :func:`metric_value`."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, an integer too long to convert, deep nesting
            row = None
        if not isinstance(row, dict) or type(row.get("step")) is not int or not 0 <= row["step"] < 2**63:
            warnings.warn(f"{path}, line {number}: not a complete metrics row (an interrupted write?); dropped",
                          RuntimeWarning, stacklevel=2)
            continue
        rows.append(row)
    return rows


def metric_value(row: dict, key: str) -> Optional[float]:
    """The finite number a metrics row logs under ``key``, else None (absent, NaN, inf, not a number, too large)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the float range
        return None
    return value if math.isfinite(value) else None


# the phases of a step; they add up to the step's wall time (other_time: the rest of train_step). The background
# media writer's own time (background_media_time) overlaps them and is not one of them.
PHASE_TIMES = ("rollout_time", "reward_time", "ref_model_time", "grpo_loop_time", "media_time", "other_time")
# every logged number that is a duration (the background workers' own times overlap the phases)
TIMING_METRICS = PHASE_TIMES + ("background_media_time", "background_reward_time")


def manifold_error_key(rows: list) -> Optional[str]:
    """The per-step mean manifold error a toy reward logs (``gathered_<reward>_manifold_error_reward_mean``), if any."""
    keys = sorted({k for row in rows for k in row if "manifold_error" in k and k.endswith("_mean")})
    return keys[0] if keys else None


def summarize_run(rows: list, window: int) -> Dict[str, float]:
    """What a run learned, from its ``metrics.jsonl`` rows: the mean GRPO reward of the first and the last ``window``
    steps, the gain, the step-to-step std of the first window and gain / std; the same window means and the maximum
    of the manifold error when a toy reward logs one; the mean seconds per step (sum of the phase times)."""
    rows = training_rows(rows)
    if len(rows) < 2 * window:
        raise ValueError(f"need at least {2 * window} logged steps, got {len(rows)}")
    reward = [row["gathered_avg_reward_mean"] for row in rows]
    first, last = reward[:window], reward[-window:]
    noise = statistics.pstdev(first)
    summary = {"steps": len(rows), "first_mean": statistics.fmean(first), "last_mean": statistics.fmean(last),
               "first_step_std": noise}
    summary["gain"] = summary["last_mean"] - summary["first_mean"]
    summary["gain_over_noise"] = summary["gain"] / noise if noise > 0 else float("inf")
    key = manifold_error_key(rows)
    if key is not None:
        error = [row[key] for row in rows]
        summary.update(manifold_first_mean=statistics.fmean(error[:window]),
                       manifold_last_mean=statistics.fmean(error[-window:]), manifold_max=max(error))
    summary["seconds_per_step"] = statistics.fmean(sum(row.get(k, 0.0) for k in PHASE_TIMES) for row in rows)
    return summary


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop rows after ``last_step`` (a resumed run rewrites the steps a crash left half-logged); the file is
    replaced atomically, so a crash here leaves the old history whole."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        rows = [r for r in read_metrics(run_dir) if r["step"] <= last_step]
        atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


def prune_rollout_media(run_dir: Path, keep: int) -> None:
    """Keep only the newest ``keep`` step folders under rl_samples/ (``keep <= 0`` keeps everything)."""
    root = Path(run_dir) / "rl_samples"
    if keep <= 0 or not root.exists():
        return
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)

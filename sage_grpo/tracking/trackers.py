"""Experiment trackers (``--report_to``): TensorBoard, Weights & Biases and SwanLab, each through its own library.

Only the main process (rank 0) starts trackers and logs to them. Each receives

* every step's scalars under the TensorBoard tags (``Reward/...``, ``KL/...``, ``Time/...``, ``Train/...``,
  :func:`sage_grpo.tracking.run_dir.tensorboard_tag`) at the global step (1-based, the x axis of ``metrics.jsonl``);
* the rollout videos the main process wrote under ``rl_samples/`` (``Video/rollout``, captioned with prompt, seed,
  reward and advantage) and the validation videos (``Video/validation``), at the step they belong to: wandb gets the
  mp4 files, SwanLab animated GIFs (the only video format it takes); TensorBoard stays scalars only, as the
  reference's (the mp4s are in the run directory);
* the resolved configuration as the run config (wandb, SwanLab; TensorBoard has none: ``run_config.yaml`` is it).

``metrics.jsonl``, ``train.log`` and the console line are written whatever ``--report_to`` says
(:class:`sage_grpo.tracking.run_dir.MetricsLogger`); ``--report_to none`` starts no tracker.

Resume: a tracker with run ids (wandb, SwanLab) records its run's id in ``trackers.json`` of the run directory, and a
resumed run passes it back (``id=..., resume="allow"``), so an online run continues the same tracker run. Offline,
each start writes its own run folder under that id, uploaded later with ``wandb sync`` / ``swanlab sync``.
"""

import importlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sage_grpo.config.validation import ConfigError
from sage_grpo.safe_io import read_json_object

RUN_IDS_FILE = "trackers.json"
MAX_RUN_IDS_BYTES = 1 << 20  # a few run ids
ROLLOUT_VIDEOS, VALIDATION_VIDEOS = "Video/rollout", "Video/validation"


@dataclass
class LoggedVideo:
    """A video the run wrote, as the trackers receive it."""

    path: Path
    caption: str
    fps: int

    @cached_property
    def gif(self) -> bytes:
        from sage_grpo.video_io import mp4_to_gif

        return mp4_to_gif(self.path, self.fps)


@dataclass(frozen=True)
class TrackerRun:
    """What every tracker starts from: where the run lives, its names and config, and the id to continue."""

    run_dir: Path
    project: str
    name: str
    config: Dict[str, Any]
    run_id: Optional[str]  # a resumed run's id (trackers.json), None for a new tracker run


class TensorBoardTracker:
    """Scalars into ``<run_dir>/tb``."""

    module, install = "tensorboard", "pip install tensorboard (it is in requirements.txt)"
    start_hint = "check that the run directory is writable"

    def __init__(self, run: TrackerRun):
        from torch.utils.tensorboard import SummaryWriter

        self.run_id = None
        self._writer = SummaryWriter(log_dir=str(run.run_dir / "tb"))

    def log_scalars(self, scalars: Dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def log_videos(self, key: str, videos: List[LoggedVideo], step: int) -> None:
        """Scalars only: the videos are the mp4s of the run directory."""

    def finish(self) -> None:
        self._writer.close()


class WandbTracker:
    """A wandb run (``WANDB_MODE=offline`` keeps it local). Its files go to ``<run_dir>/wandb`` unless
    ``WANDB_DIR`` says otherwise."""

    module, install = "wandb", "pip install wandb (or pip install 'sage-grpo[wandb]')"
    start_hint = "run `wandb login`, or set WANDB_MODE=offline to keep the run local"

    def __init__(self, run: TrackerRun):
        import wandb

        self._wandb = wandb
        resume = {"id": run.run_id, "resume": "allow"} if run.run_id else {}
        self._run = wandb.init(project=run.project, name=run.name, config=run.config,
                               dir=None if "WANDB_DIR" in os.environ else str(run.run_dir), **resume)
        self.run_id = self._run.id

    def log_scalars(self, scalars: Dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def log_videos(self, key: str, videos: List[LoggedVideo], step: int) -> None:
        self._run.log({key: [self._wandb.Video(str(v.path), caption=v.caption) for v in videos]}, step=step)

    def finish(self) -> None:
        self._run.finish()


class SwanLabTracker:
    """A SwanLab run (``SWANLAB_MODE=offline`` or ``local`` keeps it local). Its files go to ``<run_dir>/swanlog``
    unless ``SWANLAB_LOG_DIR`` says otherwise."""

    module, install = "swanlab", "pip install swanlab (or pip install 'sage-grpo[swanlab]')"
    start_hint = "run `swanlab login`, or set SWANLAB_MODE=offline (or local) to keep the run local"

    def __init__(self, run: TrackerRun):
        import swanlab

        self._swanlab = swanlab
        resume = {"id": run.run_id, "resume": "allow"} if run.run_id else {}
        log_dir = None if "SWANLAB_LOG_DIR" in os.environ else str(run.run_dir / "swanlog")
        self._run = swanlab.init(project=run.project, name=run.name, config=run.config, log_dir=log_dir, **resume)
        self.run_id = self._run.id

    def log_scalars(self, scalars: Dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def log_videos(self, key: str, videos: List[LoggedVideo], step: int) -> None:
        from io import BytesIO

        self._run.log({key: [self._swanlab.Video(BytesIO(v.gif), caption=v.caption) for v in videos]}, step=step)

    def finish(self) -> None:
        self._run.finish()


# The one table of trackers: --report_to name -> class (its import name and install hint are class attributes).
TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "swanlab": SwanLabTracker}


def parse_report_to(values: Sequence[str]) -> Tuple[str, ...]:
    """``--report_to`` values, each a name or a comma-separated list, as tracker names in order without repeats;
    ``none`` (alone) gives no tracker."""
    names = [name.strip().lower() for value in values for name in value.split(",") if name.strip()]
    valid = ", ".join([*TRACKERS, "none"])
    for name in names:
        if name not in TRACKERS and name != "none":
            raise ConfigError(f"--report_to {name!r} is not a tracker; choose from {valid} (several: "
                              "--report_to tensorboard wandb, or tensorboard,wandb)")
    if not names:
        raise ConfigError(f"--report_to is empty; give one or more of {valid}")
    if "none" in names and len(set(names)) > 1:
        raise ConfigError(f"--report_to {' '.join(values)}: 'none' disables every tracker and cannot be combined "
                          "with one; pass either none or the trackers you want")
    return tuple(dict.fromkeys(name for name in names if name != "none"))


def check_report_to(values: Sequence[str]) -> Tuple[str, ...]:
    """Parse ``--report_to`` and import each tracker's package, before any model loads (a missing package is a
    :class:`ConfigError` with the command that installs it)."""
    names = parse_report_to(values)
    for name in names:
        tracker = TRACKERS[name]
        try:
            importlib.import_module(tracker.module)
        except ImportError as err:
            raise ConfigError(f"--report_to {name}: the {tracker.module} package cannot be imported ({err}); "
                              f"install it with {tracker.install}, or leave {name} out of --report_to") from None
    return names


def read_run_ids(run_dir: Path) -> Dict[str, str]:
    path = run_dir / RUN_IDS_FILE
    if not path.exists():
        return {}
    fix = "delete it to start new tracker runs"
    ids = read_json_object(path, "the tracker run ids", fix, error=ConfigError, max_bytes=MAX_RUN_IDS_BYTES)
    if not all(isinstance(v, str) for v in ids.values()):
        raise ConfigError(f"{path} is not a JSON object of tracker run ids; {fix}")
    return ids


def start_trackers(names: Sequence[str], run_dir: Path, *, project: str, run_name: Optional[str],
                   config: Dict[str, Any], resuming: bool) -> list:
    """Start the trackers ``names`` (main process only). A resumed run continues the tracker runs recorded in
    ``trackers.json``; the ids of the runs started here are recorded there."""
    ids = read_run_ids(run_dir) if resuming else {}
    name = run_name or Path(run_dir).resolve().name
    started = []
    for tracker_name in names:
        tracker = TRACKERS[tracker_name]
        try:
            started.append(tracker(TrackerRun(run_dir, project, name, config, ids.get(tracker_name))))
        except Exception as err:  # e.g. online without a login: the library's reason, and how to run offline
            raise ConfigError(f"--report_to {tracker_name}: the tracker did not start: {err} ({tracker.start_hint}, "
                              f"or leave {tracker_name} out of --report_to)") from err
        if started[-1].run_id is not None:
            ids[tracker_name] = started[-1].run_id
    if ids:
        from sage_grpo.safe_io import atomic_write

        atomic_write(run_dir / RUN_IDS_FILE, json.dumps(ids, indent=2) + "\n")
    return started

"""The run directory a start claims: checked before any model loads (:func:`plan_run_dir`), taken before the run
writes in it (:meth:`RunDirPlan.take`).

* **Where.** ``--output_dir`` must be reachable and writable: a dangling symbolic link on its path or a read-only
  location is one line naming it and a writable alternative, before anything loads.
* **Whose.** One run at a time: the lock of :mod:`sage_grpo.tracking.run_lock`, probed early (a second run, or an
  ``--overwrite_output_dir``, is refused in seconds) and taken by the writing process (rank 0) right before the
  directory changes.
* **What it reads stays.** Every path the configuration names (each option's value that names an existing file or
  folder, found generically over the options, JSON-valued ones included; the ``--config`` file; the reference images
  of the prompt CSVs) is an input: ``--overwrite_output_dir``, ``--keep_checkpoints`` pruning and the move of an
  abandoned branch refuse, before anything is deleted or moved, when an input lies inside what they would delete or
  move. The checkpoint a run resumes from may be pruned once newer ones exist (it has been read whole; that is what
  ``--keep_checkpoints`` is for).
* **One branch.** A resume from a checkpoint older than the directory's newest moves the later branch aside
  (:mod:`sage_grpo.tracking.branches`).
"""

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from sage_grpo.checkpoint_layout import list_checkpoints
from sage_grpo.config.schema import config_file
from sage_grpo.config.sections import flat_items
from sage_grpo.config.validation import ConfigError
from sage_grpo.distributed.rollout_sync import run_on_main
from sage_grpo.tracking.branches import later_parts, move_branch_aside
from sage_grpo.tracking.run_dir import (RUN_MARKER, check_run_dir, overwrite_targets, prepare_run_dir,
                                        truncate_metrics)
from sage_grpo.tracking.run_lock import acquire_run_lock, check_lock_free, release_run_locks  # noqa: F401 (the end)


def _texts(value: Any) -> Iterator[str]:
    """Every string in an option's value: lists, mappings and the JSON of JSON-valued options (reward_kwargs)."""
    if isinstance(value, str):
        yield value
        if value.lstrip().startswith(("{", "[")):
            try:
                yield from _texts(json.loads(value))
            except (ValueError, RecursionError):
                pass
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)


def config_inputs(cfg: Any, images: Iterable[str] = ()) -> Dict[str, Path]:
    """{what: path} of everything a run reads that its configuration names: the ``--config`` file, every option
    value (but ``--output_dir``) that names an existing file or folder, and ``images`` (the prompts' reference
    images). No list of path options to keep up to date: a new option that names a file is found by its value."""
    found: Dict[str, Path] = {}
    source = config_file(cfg)
    if source:
        found[f"--config {source}"] = Path(source)
    for name, value in flat_items(cfg):
        if name == "output_dir":
            continue
        for text in _texts(value):
            if text and os.path.lexists(os.path.expanduser(text)):
                found[f"--{name} {text}"] = Path(text).expanduser()
    for image in sorted(set(images) - {""}):
        found[f"the reference image {image}"] = Path(image)
    return found


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def writable_alternative(run_dir: Path) -> str:
    """A run folder of the same name where this user can write: ./outputs, ~/sage-grpo-runs or the temp folder."""
    name = run_dir.name or "run"
    for base in (Path.cwd() / "outputs", Path.home() / "sage-grpo-runs",
                 Path(tempfile.gettempdir()) / "sage-grpo-runs"):
        if _writable(_existing(base)) and base / name != run_dir.absolute():
            return f"--output_dir {base / name}"
    return "an --output_dir on a writable file system"


def check_writable(run_dir: Path) -> None:
    """Refuse an ``--output_dir`` the run could not write: a dangling symbolic link on its path, a file in its
    path, a read-only location (a read-only mount, or no permission for this user). Changes nothing."""
    run_dir = Path(run_dir)
    for path in (run_dir.absolute(), *run_dir.absolute().parents):
        if path.is_symlink() and not path.exists():
            raise ConfigError(f"--output_dir {run_dir}: {path} is a symbolic link to {os.readlink(path)}, which does "
                              f"not exist; create that folder, or pass {writable_alternative(run_dir)}")
        if path.exists():
            break
    if not path.is_dir():
        raise ConfigError(f"--output_dir {run_dir}: {path} is a file, not a folder; pass "
                          f"{writable_alternative(run_dir)}")
    if not _writable(path):
        raise ConfigError(f"--output_dir {run_dir}: {path} is read-only (a read-only mount, or no write permission "
                          f"for this user), so the run could write nothing there; pass {writable_alternative(run_dir)}")


def _resolved(path: Path) -> Path:
    try:
        return Path(os.path.expanduser(path)).resolve()
    except (OSError, RuntimeError):  # a link loop
        return Path(os.path.abspath(path))


@dataclass
class RunDirPlan:
    """What a start will do to its run directory (built before any model loads; :meth:`take` does it)."""

    run_dir: Path
    overwrite: bool
    resuming: bool  # a resume, or a restart from step 0 of a run without a checkpoint (``restart``)
    restart: bool
    keep_checkpoints: int
    inputs: Dict[str, Path]  # what the run reads: config_inputs
    resume_path: Optional[Path] = None
    resume_step: Optional[int] = None
    resume_updates: Optional[int] = None

    @classmethod
    def of(cls, output: Any, inputs: Dict[str, Path], check: Any = None, restart: bool = False) -> "RunDirPlan":
        """The plan of the configuration's ``output`` section, reading ``inputs`` (:func:`config_inputs`);
        ``check``: the resume's :class:`~sage_grpo.resume.ResumeCheck` (None: no resume)."""
        state = check.training_state if check is not None else {}
        return cls(Path(output.output_dir), output.overwrite_output_dir, check is not None or restart, restart,
                   output.keep_checkpoints, inputs, check.path if check is not None else None,
                   state.get("global_step"), state.get("update_steps"))

    def check(self) -> None:
        """Everything :meth:`take` would refuse, without changing anything (on the writing process)."""
        check_writable(self.run_dir)
        check_lock_free(self.run_dir)
        self.check_inputs_kept()

    def _doomed(self) -> List[Tuple[Path, str, str]]:
        """(path, what would happen to it, the way out) for everything the run would delete or move."""
        doomed = []
        if self.overwrite and not self.resuming and (self.run_dir / RUN_MARKER).exists():
            doomed += [(path, "--overwrite_output_dir true would delete", "choose another --output_dir")
                       for path in overwrite_targets(self.run_dir)]
        if self.resume_step is not None:
            doomed += [(path, f"resuming {self.resume_path} moves the later branch aside, with",
                        "resume into a new --output_dir") for path in
                       later_parts(self.run_dir, self.resume_step, self.resume_updates)]
        if self.keep_checkpoints > 0:
            doomed += [(path, f"--keep_checkpoints {self.keep_checkpoints} would delete", "pass --keep_checkpoints 0")
                       for path in list_checkpoints(self.run_dir).values()]
        return doomed

    def check_inputs_kept(self) -> None:
        """Refuse when an input lies inside what the run would delete or move (one line naming both)."""
        doomed = [(_resolved(path), path, what, way_out) for path, what, way_out in self._doomed()]
        resumed = _resolved(self.resume_path) if self.resume_path is not None else None
        for label, source in self.inputs.items():
            read = _resolved(source)
            for target, path, what, way_out in doomed:
                if read == resumed == target and what.startswith("--keep_checkpoints"):
                    continue  # the checkpoint resumed from: read whole at the start, pruned like any older one
                if read == target or target in read.parents:
                    raise ConfigError(f"{what} {path}, which {'is' if read == target else 'holds'} {label}: the "
                                      "run would lose a file it reads. Copy it outside --output_dir "
                                      f"{self.run_dir} and pass the copy, or {way_out}")

    def take(self, notes: List[str]) -> Path:
        """Lock the run directory (made if needed) for this process, then, still refusing before any change when an
        input would be lost: clear an earlier run (``--overwrite_output_dir``), move an abandoned branch aside, and
        drop the logged steps a restart takes again. Lines for the log (a stale lock taken over, a branch moved) go
        to ``notes``. Call on the writing process only."""
        check_writable(self.run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            lock = acquire_run_lock(self.run_dir, notes.append)
        except OSError as err:
            raise ConfigError(f"--output_dir {self.run_dir}: cannot write there ({err.strerror or err}); pass "
                              f"{writable_alternative(self.run_dir)}") from None
        try:
            self.check_inputs_kept()
            prepare_run_dir(str(self.run_dir), resuming=self.resuming, overwrite=self.overwrite)
            if self.resume_step is not None:
                moved = move_branch_aside(self.run_dir, self.resume_step, self.resume_updates, self.resume_path)
                notes.extend([moved] if moved else [])
            if self.restart:  # the attempt that stopped before its first checkpoint logged steps taken again
                truncate_metrics(self.run_dir, 0)
        except BaseException:
            lock.release()
            raise
        return self.run_dir


def plan_run_dir(output: Any, dims: Any, check: Any, restart: bool, inputs: Dict[str, Any],
                 read: Dict[str, Path]) -> RunDirPlan:
    """Check the run directory (``output``: the configuration's output section) on every rank before any model
    loads (:func:`check_run_dir`: another run's files, an output inside ``inputs``, {flag: path}), then on the
    writing process what taking it would refuse (:meth:`RunDirPlan.check`; every rank raises its refusal). ``read``:
    everything the run reads (:func:`config_inputs`). Returns the plan :meth:`RunDirPlan.take` carries out."""
    check_run_dir(output.output_dir, resuming=check is not None or restart, overwrite=output.overwrite_output_dir,
                  inputs=inputs)
    plan = RunDirPlan.of(output, read, check, restart)
    run_on_main(plan.check, dims)
    return plan

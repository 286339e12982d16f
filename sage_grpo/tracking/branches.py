"""A resume from a checkpoint older than the run directory's newest starts a new branch of the run; the later steps
of the old one are moved aside, never deleted and never mixed with the new ones.

Resuming ``checkpoint-2`` of a run directory that holds ``checkpoint-3`` and ``checkpoint-4`` (a researcher backing up
to before a bad step) moves, before the run writes anything::

    checkpoint-3/, checkpoint-4/                  -> abandoned/<date>-after-step-2/checkpoint-3/, checkpoint-4/
    metrics.jsonl rows of steps 3, 4, ...          -> abandoned/<date>-after-step-2/metrics.jsonl
    samples/step_000003/, ...   (validation)       -> abandoned/<date>-after-step-2/samples/...
    rl_samples/<update>/ from the resumed update on -> abandoned/<date>-after-step-2/rl_samples/...

so ``latest`` and ``--keep_checkpoints`` see only the branch being trained, and ``metrics.jsonl``'s steps increase.
A resume from the newest checkpoint (a crash, a requeue) moves nothing: the steps logged after it are taken again
and their rows replaced (``truncate_metrics``), as before.
"""

import json
import os
import re
import time
from pathlib import Path
from typing import List, Optional

from sage_grpo.checkpoint_layout import list_checkpoints
from sage_grpo.safe_io import atomic_write, fsync_dir
from sage_grpo.tracking.run_dir import read_metrics

ABANDONED_DIR = "abandoned"
_SAMPLES = re.compile(r"^step_(\d+)$")


def later_parts(run_dir: Path, step: int, updates: Optional[int]) -> List[Path]:
    """What the run directory holds of steps after ``step`` when a checkpoint newer than it exists (else nothing):
    those checkpoints (newest first), validation-video folders, and rollout-media folders from update ``updates``
    on (their folders are numbered by the update count at the rollout, so the resumed one's is the first retaken)."""
    run_dir = Path(run_dir)
    newer = [path for number, path in list_checkpoints(run_dir).items() if number > step]
    if not newer:
        return []
    parts = newer[::-1]
    samples = run_dir / "samples"
    if samples.is_dir():
        parts += sorted(p for p in samples.iterdir() if (m := _SAMPLES.match(p.name)) and int(m.group(1)) > step)
    media = run_dir / "rl_samples"
    if updates is not None and media.is_dir():
        parts += sorted(p for p in media.iterdir() if p.name.isdigit() and int(p.name) >= updates)
    return parts


def _branch_folder(run_dir: Path, step: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = run_dir / ABANDONED_DIR / f"{stamp}-after-step-{step}"
    suffix = 1
    while folder.exists():  # two branches abandoned within one second
        suffix += 1
        folder = run_dir / ABANDONED_DIR / f"{stamp}-after-step-{step}-{suffix}"
    return folder


def move_branch_aside(run_dir: Path, step: int, updates: Optional[int], resumed: Path) -> Optional[str]:
    """Move the later steps of the branch that a resume from ``resumed`` (at ``step``, update ``updates``) leaves
    (:func:`later_parts`) into ``abandoned/<date>-after-step-<step>/``; returns the line that says so, or None when
    there is no later branch. The metrics rows go first (both files rewritten atomically), then the folders, the
    newest checkpoint first: an interruption leaves every file in one of the two places."""
    run_dir = Path(run_dir)
    parts = later_parts(run_dir, step, updates)
    if not parts:
        return None
    folder = _branch_folder(run_dir, step)
    folder.mkdir(parents=True)
    rows = read_metrics(run_dir)
    later = [row for row in rows if row["step"] > step]
    if later:
        atomic_write(folder / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in later))
        atomic_write(run_dir / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows if row["step"] <= step))
    for part in parts:
        target = folder / part.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(part, target)
    fsync_dir(run_dir)
    checkpoints = [p.name for p in parts if p.parent == run_dir]
    return (f"resuming {resumed} (step {step}) in a run directory that had gone on to {checkpoints[0]}: the "
            f"later branch ({', '.join(sorted(checkpoints, key=_step))}, {len(later)} metrics rows, "
            f"{len(parts) - len(checkpoints)} media folders) is moved to {folder}; nothing of it is deleted (resume "
            "one of its checkpoints into a new --output_dir to continue it)")


def _step(name: str) -> int:
    return int(name.rsplit("-", 1)[1])

"""A checkpoint's files and folders: the single files rank 0 writes, reading them back, finding the checkpoint a
resume names, pruning old ones, and full copies of sharded state for those files."""

import shutil
from pathlib import Path
from typing import Dict, Optional

import torch
from safetensors.torch import load_file, save_file

from sage_grpo.checkpoint_layout import (ANCHOR_FILE, CONFIG_FILE, DCP_DIR, EMA_FILE, OPTIMIZER_FILE,
                                         TRAINING_STATE_FILE, TRANSFORMER_FILE, list_checkpoints)
from sage_grpo.distributed.collectives import first_message_over_world
from sage_grpo.safe_io import CheckpointError, atomic_write, check_finite, disk_full_as_error, nbytes_of

StateDict = Dict[str, torch.Tensor]


def finite_state(state, checkpoint: Path, name: str):
    """``state`` of the checkpoint's file ``name``, refused when it holds NaN or inf (:func:`check_finite`)."""
    check_finite(state, str(checkpoint / name))
    return state


def finite_on_every_rank(state, source: str) -> None:
    """:func:`check_finite` on each rank's shards of ``state``, raised on every rank when any rank finds NaN or inf (a
    rank that raised alone would leave the others waiting in the next collective)."""
    try:
        check_finite(state, source)
        found = ""
    except CheckpointError as err:
        found = str(err)
    found = first_message_over_world(found)
    if found:
        raise CheckpointError(found)


def gather_to_main(state: StateDict, is_main: bool) -> StateDict:
    """Full CPU copies of ``state`` on the main rank, one tensor at a time (every rank joins each all-gather; on one
    process: plain CPU copies)."""
    from torch.distributed.tensor import DTensor

    gathered = {}
    for name, tensor in state.items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if is_main:
            gathered[name] = full.detach().to("cpu").contiguous()
        del full
    return gathered


def _contiguous_cpu(tensors: StateDict) -> StateDict:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def write_checkpoint_files(directory: Path, *, model_state: StateDict, training_state: dict,
                           config_yaml: Optional[str] = None, optimizer_state: Optional[dict] = None,
                           anchor_state: Optional[StateDict] = None, ema_state: Optional[StateDict] = None) -> None:
    """The single files of a checkpoint, into ``directory`` (made if needed): the full trainable weights, the training
    state and the config; the optimizer state and the anchor weights when given (one process; several processes keep
    them in the DCP shards); the whole EMA when given."""
    directory = Path(directory)
    (directory / TRANSFORMER_FILE).parent.mkdir(parents=True, exist_ok=True)
    # A full disk is named with the file and the space the whole checkpoint needs (torch's own error is
    # "basic_ios::clear: iostream error").
    needed = (nbytes_of(model_state) + nbytes_of(anchor_state) + nbytes_of(optimizer_state) + nbytes_of(ema_state)
              + (1 << 20))
    with disk_full_as_error(directory / TRANSFORMER_FILE, needed):
        save_file(_contiguous_cpu(model_state), str(directory / TRANSFORMER_FILE))
    for file, state in ((ANCHOR_FILE, anchor_state), (EMA_FILE, ema_state)):
        if state is not None:
            (directory / file).parent.mkdir(exist_ok=True)
            with disk_full_as_error(directory / file, needed):
                save_file(_contiguous_cpu(state), str(directory / file))
    if optimizer_state is not None:
        with disk_full_as_error(directory / OPTIMIZER_FILE, needed):
            torch.save(optimizer_state, directory / OPTIMIZER_FILE)
    with disk_full_as_error(directory / TRAINING_STATE_FILE, needed):
        torch.save(training_state, directory / TRAINING_STATE_FILE)
    if config_yaml is not None:
        atomic_write(directory / CONFIG_FILE, config_yaml)


def load_safetensors(path: Path) -> StateDict:
    """A safetensors file, naming ``path`` when it is missing or unreadable."""
    try:
        return load_file(str(path))
    except Exception as err:  # SafetensorError, OSError
        raise CheckpointError(f"cannot read {path}: {err} (truncated or not a safetensors file)") from None


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def resumes(value: Optional[str], run_dir: Path) -> bool:
    """Whether ``--resume_from_checkpoint value`` resumes: ``auto`` only when ``run_dir`` holds a checkpoint (a
    published ``checkpoint-N``: complete by construction, its temporary directory was renamed last)."""
    if value == "auto":
        return bool(list_checkpoints(run_dir))
    return value is not None


def resolve_resume_path(value: str, run_dir: Path) -> Path:
    """``--resume_from_checkpoint``: a checkpoint directory, or ``latest`` / ``auto`` (newest one in the run
    directory; see :func:`resumes` for ``auto`` without one)."""
    if value in ("latest", "auto"):
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            raise FileNotFoundError(f"--resume_from_checkpoint {value}: no checkpoint-N directory in {run_dir}")
        return list(checkpoints.values())[-1]
    path = Path(value)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: no such directory; pass a checkpoint-N folder "
                                "or 'latest'")
    if not (path / TRAINING_STATE_FILE).is_file():
        found = list(list_checkpoints(path))
        hint = f" (it holds checkpoint-{found[-1]}; pass that folder, or 'latest')" if found else ""
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: not a sage-grpo checkpoint, "
                                f"{path / TRAINING_STATE_FILE} is missing{hint}")
    return path


def prune_checkpoints(run_dir: Path, keep: int, current: Optional[int] = None) -> None:
    """Delete all but the newest ``keep`` checkpoints (``keep <= 0`` keeps all) up to the step ``current`` just
    saved: the branch being trained is never pruned for a newer checkpoint of another one (a resume from an older
    checkpoint moves those aside first, ``sage_grpo/tracking/branches.py``)."""
    if keep <= 0:
        return
    ours = [path for step, path in list_checkpoints(run_dir).items() if current is None or step <= current]
    for path in ours[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


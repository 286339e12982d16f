"""Training checkpoints that resume exactly, written atomically.

``checkpoint-{step}/`` holds::

    transformer/model.safetensors   trainable weights (all weights, or the LoRA adapter weights with --use_lora)
    anchor/model.safetensors        moving-anchor (reference) weights, once the anchor has moved
    optimizer.pt                    optimizer state
    training_state.pt               counters, LR schedule, KL controller, anchor schedule, data position, RNG states
    config.yaml                     the run's resolved configuration

A checkpoint is first written to ``.checkpoint-{step}.tmp`` and renamed into place when complete, so a crash mid-save
never leaves a directory that looks like a finished checkpoint (rename is atomic on POSIX file systems).
"""

import random
import re
import shutil
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def capture_rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _contiguous_cpu(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def save_checkpoint(run_dir: Path, step: int, *, model_state: Dict[str, torch.Tensor], optimizer_state: dict,
                    training_state: dict, anchor_state: Optional[Dict[str, torch.Tensor]] = None,
                    config_yaml: Optional[str] = None) -> Path:
    """Write ``checkpoint-{step}`` atomically and return its path."""
    final = Path(run_dir) / f"checkpoint-{step}"
    tmp = Path(run_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "transformer").mkdir(parents=True)
    save_file(_contiguous_cpu(model_state), str(tmp / "transformer" / "model.safetensors"))
    if anchor_state is not None:
        (tmp / "anchor").mkdir()
        save_file(_contiguous_cpu(anchor_state), str(tmp / "anchor" / "model.safetensors"))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(training_state, tmp / "training_state.pt")
    if config_yaml is not None:
        (tmp / "config.yaml").write_text(config_yaml)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def load_checkpoint(path: Path) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` into a dict of its parts."""
    path = Path(path)
    model_file = path / "transformer" / "model.safetensors"
    if not model_file.exists() or not (path / "training_state.pt").exists():
        raise FileNotFoundError(f"{path} is not a complete sage-grpo checkpoint (expected transformer/model.safetensors "
                                "and training_state.pt)")
    anchor_file = path / "anchor" / "model.safetensors"
    return {
        "model_state": load_file(str(model_file)),
        "anchor_state": load_file(str(anchor_file)) if anchor_file.exists() else None,
        "optimizer_state": torch.load(path / "optimizer.pt", weights_only=False),
        "training_state": torch.load(path / "training_state.pt", weights_only=False),
    }


def list_checkpoints(run_dir: Path) -> Dict[int, Path]:
    root = Path(run_dir)
    if not root.exists():
        return {}
    found = {int(m.group(1)): p for p in root.iterdir() if p.is_dir() and (m := CHECKPOINT_PATTERN.match(p.name))}
    return dict(sorted(found.items()))


def resolve_resume_path(value: str, run_dir: Path) -> Path:
    """``--resume_from_checkpoint``: a checkpoint directory, or ``latest`` (newest one in the run directory)."""
    if value == "latest":
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no checkpoint-N directory in {run_dir}")
        return list(checkpoints.values())[-1]
    path = Path(value)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: no such directory; pass a checkpoint-N folder "
                                "or 'latest'")
    return path


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (``keep <= 0`` keeps all)."""
    if keep <= 0:
        return
    for path in list(list_checkpoints(run_dir).values())[:-keep]:
        shutil.rmtree(path, ignore_errors=True)

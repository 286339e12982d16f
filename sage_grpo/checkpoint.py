"""Training checkpoints that resume exactly, written atomically.

``checkpoint-{step}/`` holds::

    transformer/model.safetensors   trainable weights (all weights, or the LoRA adapter weights with --use_lora)
    anchor/model.safetensors        moving-anchor (reference) weights, once the anchor has moved
    optimizer.pt                    optimizer state
    training_state.pt               counters (the step fixes the data position and the LR), KL controller, anchor
                                    schedule, parallel layout, RNG states
    config.yaml                     the run's resolved configuration

A checkpoint is first written to ``.checkpoint-{step}.tmp`` and renamed into place when complete, so a crash mid-save
never leaves a directory that looks like a finished checkpoint (rename is atomic on POSIX file systems).

Several processes (:func:`save_sharded_checkpoint`) write instead::

    transformer_dcp/                torch.distributed.checkpoint: every rank writes its shards of
                                      model      trainable weights (the keys of transformer/model.safetensors)
                                      optimizer  {part: get_optimizer_state_dict(...)} per torch optimizer (muon, adamw)
                                      anchor     moving-anchor weights (ModelBundle.reference_state: the reference
                                                 module, or the LoRA anchor adapter), once the anchor has moved
    transformer/model.safetensors   full trainable weights gathered to rank 0, the same file a one-process run
                                    writes (what generate.py reads); always written, see below
    training_state.pt               rank 0: as above, with the RNG states of every rank and the optimizer parts
    config.yaml

All ranks write into the temporary directory, meet at a barrier, then rank 0 renames it and everybody meets again, so
the atomicity above holds for the job as a whole. DCP stores each tensor with its global shape and reshards on load,
so a checkpoint resumes on any number of processes (and on one, through :func:`load_sharded_checkpoint`). The full
export costs one all-gather of the trainable weights per checkpoint and rank 0 CPU memory for one copy of them (33 GB
in fp32 for the 8.3B model); it is what makes every checkpoint directly usable by ``generate.py``.
"""

import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from sage_grpo.checkpoint_layout import (ANCHOR_FILE, CONFIG_FILE, DCP_ANCHOR, DCP_DIR, DCP_MODEL, DCP_OPTIMIZER,
                                         OPTIMIZER_FILE, TRAINING_STATE_FILE, TRANSFORMER_FILE)
from sage_grpo.distributed.collectives import barrier
from sage_grpo.faults import fault_point
from sage_grpo.safe_io import CheckpointError, dcp_load, load_plain, read_dcp_metadata

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
StateDict = Dict[str, torch.Tensor]


def capture_rng_state() -> dict:
    """The global RNG states as plain data (tensors, numbers, strings: loadable with ``weights_only=True``)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position,
                                                     has_gauss, cached), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in state["python"]))
    name, keys, position, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)  # earlier versions: a NumPy array
    np.random.set_state((name, keys.astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _contiguous_cpu(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def save_checkpoint(run_dir: Path, step: int, *, model_state: Dict[str, torch.Tensor], optimizer_state: dict,
                    training_state: dict, anchor_state: Optional[Dict[str, torch.Tensor]] = None,
                    config_yaml: Optional[str] = None) -> Path:
    """Write ``checkpoint-{step}`` atomically and return its path."""
    final = Path(run_dir) / f"checkpoint-{step}"
    tmp = Path(run_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / TRANSFORMER_FILE).parent.mkdir(parents=True)
    save_file(_contiguous_cpu(model_state), str(tmp / TRANSFORMER_FILE))
    if anchor_state is not None:
        (tmp / ANCHOR_FILE).parent.mkdir()
        save_file(_contiguous_cpu(anchor_state), str(tmp / ANCHOR_FILE))
    torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    torch.save(training_state, tmp / TRAINING_STATE_FILE)
    if config_yaml is not None:
        (tmp / CONFIG_FILE).write_text(config_yaml)
    fault_point("checkpoint", step)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def load_checkpoint(path: Path) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` into a dict of its parts (plain data only, see
    :mod:`sage_grpo.safe_io`); a missing or unreadable part is named with its path."""
    path = Path(path)
    model_file = path / TRANSFORMER_FILE
    if not model_file.is_file():
        raise CheckpointError(f"{path} is not a complete sage-grpo checkpoint: {model_file} is missing")
    anchor_file = path / ANCHOR_FILE
    return {
        "model_state": _load_safetensors(model_file),
        "anchor_state": _load_safetensors(anchor_file) if anchor_file.exists() else None,
        "optimizer_state": load_plain(path / OPTIMIZER_FILE, "optimizer state"),
        "training_state": load_plain(path / TRAINING_STATE_FILE, "training state"),
    }


def _load_safetensors(path: Path) -> StateDict:
    try:
        return load_file(str(path))
    except Exception as err:  # SafetensorError, OSError
        raise CheckpointError(f"cannot read {path}: {err} (truncated or not a safetensors file)") from None


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
    if not (path / TRAINING_STATE_FILE).is_file():
        found = list(list_checkpoints(path))
        hint = f" (it holds checkpoint-{found[-1]}; pass that folder, or 'latest')" if found else ""
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: not a sage-grpo checkpoint, "
                                f"{path / TRAINING_STATE_FILE} is missing{hint}")
    return path


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (``keep <= 0`` keeps all)."""
    if keep <= 0:
        return
    for path in list(list_checkpoints(run_dir).values())[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- several processes (FSDP2 shards, DCP)

@dataclass
class ShardedTrainingObjects:
    """What a sharded checkpoint saves from, and restores into, in place (every rank holds its own shards).

    Weights are reached through the model bundle's state-dict callables (``ModelBundle.trainable_state_dict`` /
    ``load_trainable_state_dict``, ``reference_state`` / ``load_reference_state``), so that keys are those of a
    one-process checkpoint and LoRA (adapter tensors under peft keys, the anchor an adapter inside the policy) needs
    nothing special here. The ``*_state`` callables must return tensors that share storage with the model (under FSDP
    its DTensor shards): DCP loads into them in place.
    """

    model: torch.nn.Module  # the policy: the optimizer states are keyed by its parameter names
    optimizers: Dict[str, torch.optim.Optimizer]  # named torch optimizers (see sage_grpo.optim.optimizer_parts)
    trainable_state: Callable[[], StateDict]
    load_trainable_state: Callable[[StateDict], None]
    anchor_state: Optional[Callable[[], StateDict]] = None  # None: no KL reference
    load_anchor_state: Optional[Callable[[StateDict], None]] = None


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def _dcp_state(objects: ShardedTrainingObjects, with_anchor: bool) -> dict:
    """The nested state DCP saves or loads into (a collective: it initialises empty optimizer states)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {DCP_MODEL: dict(objects.trainable_state()),
             DCP_OPTIMIZER: {name: get_optimizer_state_dict(objects.model, opt)
                             for name, opt in objects.optimizers.items()}}
    if with_anchor:
        state[DCP_ANCHOR] = dict(objects.anchor_state())
    return state


def gather_rng_states() -> List[dict]:
    """Every rank's RNG states, in rank order, on every rank (one object all-gather)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, capture_rng_state())
    return states


def gather_to_main(state: StateDict, is_main: bool) -> StateDict:
    """Full CPU copies of ``state`` on the main rank, one tensor at a time (every rank joins each all-gather)."""
    from torch.distributed.tensor import DTensor

    gathered = {}
    for name, tensor in state.items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if is_main:
            gathered[name] = full.detach().to("cpu").contiguous()
        del full
    return gathered


def save_sharded_checkpoint(run_dir: Path, step: int, objects: ShardedTrainingObjects, *, training_state: dict,
                            save_anchor: bool, is_main: bool, device: torch.device,
                            config_yaml: Optional[str] = None) -> Path:
    """Write ``checkpoint-{step}`` from every rank (a collective) and return its path."""
    import torch.distributed.checkpoint as dcp

    final = Path(run_dir) / f"checkpoint-{step}"
    tmp = Path(run_dir) / f".checkpoint-{step}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(device)
    dcp.save(_dcp_state(objects, save_anchor), checkpoint_id=str(tmp / DCP_DIR))
    full = gather_to_main(objects.trainable_state(), is_main)
    if is_main:
        (tmp / TRANSFORMER_FILE).parent.mkdir()
        save_file(full, str(tmp / TRANSFORMER_FILE))
        torch.save(training_state, tmp / TRAINING_STATE_FILE)
        if config_yaml is not None:
            (tmp / CONFIG_FILE).write_text(config_yaml)
    del full
    fault_point("checkpoint", step)
    barrier(device)
    if is_main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    barrier(device)
    return final


def load_sharded_checkpoint(path: Path, objects: ShardedTrainingObjects) -> dict:
    """Restore weights, optimizer states and (when the checkpoint holds one and the run has a KL reference) the
    moving anchor from ``path``, in place on every rank (a collective), on any number of processes. Returns the
    training state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    path = Path(path)
    training = load_plain(path / TRAINING_STATE_FILE, "training state")
    saved_parts = training.get("optimizer_parts")
    if saved_parts is not None and sorted(saved_parts) != sorted(objects.optimizers):
        raise ValueError(f"{path} holds optimizer states {sorted(saved_parts)} but this run builds "
                         f"{sorted(objects.optimizers)}; resume with the same --use_muon / --use_lora")
    stored = set(read_dcp_metadata(path / DCP_DIR).state_dict_metadata)
    with_anchor = objects.anchor_state is not None and any(key.startswith(f"{DCP_ANCHOR}.") for key in stored)
    state = _dcp_state(objects, with_anchor)
    expected = [f"{part}.{n}" for part in (DCP_MODEL, DCP_ANCHOR) for n in state.get(part, {})]
    missing = sorted(k for k in expected if k not in stored)
    if missing:
        raise KeyError(f"{path / DCP_DIR} lacks {len(missing)} weights of this model, e.g. {missing[:5]}")
    # Partial load: optimizer entries of parameters that never had a gradient are absent from the checkpoint and
    # keep their freshly initialised values; every weight was checked above.
    dcp_load(state, path / DCP_DIR, allow_partial_load=True)
    # The weights were loaded in place; the bundle's loaders also check the keys (and mark a LoRA anchor ready).
    objects.load_trainable_state(state[DCP_MODEL])
    for name, optimizer in objects.optimizers.items():
        set_optimizer_state_dict(objects.model, optimizer, state[DCP_OPTIMIZER][name])
    if with_anchor:
        objects.load_anchor_state(state[DCP_ANCHOR])
    return training

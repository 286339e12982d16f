"""Training checkpoints that resume exactly, written atomically by one :class:`CheckpointManager`.

The trainer builds the manager once with the stateful objects it owns: the model bundle (its trainable and anchor
state dicts, LoRA's extra folder), the optimizer, the KL controller, the moving-anchor schedule, its counters, and the
parallel layout. ``save(step)`` writes ``checkpoint-{step}``; ``load(path, training_state)`` restores all of them in
place, the small ones through their ``state_dict()``/``load_state_dict()`` (as torchtitan's checkpoint manager does).
The training loop only says when.

``checkpoint-{step}/`` holds::

    transformer/model.safetensors   trainable weights (all weights, or the LoRA adapter weights with --use_lora)
    training_state.pt               counters (the step fixes the data position and the LR), KL controller, anchor
                                    schedule, drift guard (``--drift_guard``), parallel layout, RNG states
    config.yaml                     the run's resolved configuration
    lora/                           LoRA runs not sharded by FSDP: the peft adapter folder
    ema/model.safetensors           --ema_decay: the EMA of the trainable weights (whole; on several processes gathered
                                    to rank 0 like transformer/, and sharded in the DCP part ``ema``)

and, written by one process::

    anchor/model.safetensors        moving-anchor (reference) weights, once the anchor has moved
    optimizer.pt                    optimizer state

or, written by several processes::

    transformer_dcp/                torch.distributed.checkpoint: every rank writes its shards of
                                      model      trainable weights (the keys of transformer/model.safetensors)
                                      optimizer  {part: get_optimizer_state_dict(...)} per torch optimizer (muon, adamw)
                                      anchor     moving-anchor weights (the bundle's reference_state: the reference
                                                 module, or the LoRA anchor adapter), once the anchor has moved
                                      ema        the EMA's shards (--ema_decay)

Several processes record the RNG states of every rank (``rng_per_rank``) and the optimizer parts in the training
state, one process its own RNG states (``rng``). ``transformer/model.safetensors`` is in both formats (gathered to
rank 0 from several processes): it is what ``generate.py`` and the export read. The full gather costs one
all-gather of the trainable weights per checkpoint and rank 0 CPU memory for one copy of them (33 GB in fp32 for the
8.3B model). DCP stores each tensor with its global shape and reshards on load, so a sharded checkpoint resumes on
any number of processes, one included; a one-process checkpoint resumes on one process.

Only where the optimizer state and the anchor live differs; the rest is one code path for one and many processes:
the training state, the full trainable weights, the config, the LoRA folder, the pruning and the atomic write. Every
rank writes into ``.checkpoint-{step}.tmp``; once every file is there (the fault-injection point ``checkpoint``) all
meet at a barrier, rank 0 renames it into place and all meet again, so a crash mid-save never leaves a directory that
looks like a finished checkpoint (rename is atomic on POSIX file systems). On several processes ``save`` and
``load`` are collectives: every rank enters each of their collectives, in the same order.
"""

import random
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.stateful import Stateful

from sage_grpo.checkpoint_layout import (ANCHOR_FILE, CONFIG_FILE, DCP_ANCHOR, DCP_DIR, DCP_EMA, DCP_MODEL,
                                         DCP_OPTIMIZER, EMA_FILE, OPTIMIZER_FILE, TRAINING_STATE_FILE, TRANSFORMER_FILE,
                                         LORA_DIR, list_checkpoints)
from sage_grpo.distributed.collectives import barrier, first_message_over_world
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.parallelize import is_sharded
from sage_grpo.faults import fault_point
from sage_grpo.optim.optimizers import optimizer_parts
from sage_grpo.rl.anchor import MovingAnchorSchedule
from sage_grpo.safe_io import (CheckpointError, DiskFullError, atomic_write, check_finite, dcp_load, disk_full_as_error,
                               disk_full_error, fsync_dir, fsync_tree, load_plain, nbytes_of, read_dcp_metadata)

StateDict = Dict[str, torch.Tensor]


def _finite(state, checkpoint: Path, name: str):
    """``state`` of the checkpoint's file ``name``, refused when it holds NaN or inf (:func:`check_finite`)."""
    check_finite(state, str(checkpoint / name))
    return state


def _finite_on_every_rank(state, source: str) -> None:
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


def capture_rng_state() -> dict:
    """The global RNG states as plain data (tensors, numbers, strings: loadable with ``weights_only=True``)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position,
                                                     has_gauss, cached), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _host_rng_states(state: dict) -> Tuple[tuple, tuple]:
    """The Python and NumPy states of a saved RNG state, as ``setstate`` and ``set_state`` take them."""
    name, keys, position, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)  # earlier versions: a NumPy array
    return (tuple(tuple(x) if isinstance(x, list) else x for x in state["python"]),
            (name, keys.astype(np.uint32), position, has_gauss, cached))


def check_rng_state(state: Any, source: str) -> None:
    """Refuse a saved RNG state (``source`` names it) that the global RNGs would not take: it is restored only
    after the models have loaded, so a wrong one is named here, before (tried on throwaway generators)."""
    try:
        python, numpy_state = _host_rng_states(state)
        random.Random().setstate(python)
        np.random.RandomState().set_state(numpy_state)
        torch.Generator().set_state(state["torch"])
    except Exception as err:  # noqa: BLE001 - a garbled state fails in many ways (KeyError, TypeError, ValueError)
        raise CheckpointError(f"{source} is not a saved RNG state ({type(err).__name__}: {str(err)[:150]})") from None


def restore_rng_state(state: dict) -> List[str]:
    """Set the global RNGs to ``state``; returns notes on what could not be restored. The CUDA states go to the
    devices this process sees, by index: a machine that sees fewer GPUs than the one that saved (another
    ``CUDA_VISIBLE_DEVICES``) restores the first ones and says which were left (rollout noise comes from CPU
    generators, so only CUDA-side randomness such as dropout on the missing devices differs)."""
    notes: List[str] = []
    python, numpy_state = _host_rng_states(state)
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        saved, visible = state["cuda"], torch.cuda.device_count()
        for index, device_state in enumerate(saved[:visible]):
            torch.cuda.set_rng_state(device_state, index)
        if len(saved) > visible:
            notes.append(f"note: the checkpoint holds CUDA RNG states of {len(saved)} GPUs and this process sees "
                         f"{visible}: those of cuda:{visible} to cuda:{len(saved) - 1} are not restored")
    return notes


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def gather_rng_states() -> List[dict]:
    """Every rank's RNG states, in rank order, on every rank (one object all-gather)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, capture_rng_state())
    return states


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


# ---------------------------------------------------------------- files and directories

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


def _load_safetensors(path: Path) -> StateDict:
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


# ---------------------------------------------------------------- the manager

class CheckpointedModels(Protocol):
    """What the manager uses of the model bundle (``ModelBundle``).

    State dicts are keyed as in a one-process checkpoint (with LoRA: adapter tensors under peft keys, the anchor an
    adapter inside the policy), and their tensors share storage with the model (under FSDP its DTensor shards): DCP
    loads into them in place. ``reference`` is None without a KL reference."""

    policy: torch.nn.Module
    reference: Optional[torch.nn.Module]

    def trainable_state_dict(self) -> StateDict: ...

    def load_trainable_state_dict(self, state: StateDict) -> None: ...

    def reference_state(self) -> StateDict: ...

    def load_reference_state(self, state: StateDict) -> None: ...

    def save_extras(self, checkpoint_dir: Path) -> None: ...


class CheckpointManager:
    """Saves and restores everything a run needs to continue exactly (module docstring). Every rank builds one and
    calls :meth:`save` and :meth:`load` at the same points.

    ``counters``' state dict holds the training state's ``global_step``, ``update_steps`` and ``micro_steps``;
    ``ema`` is the :class:`~sage_grpo.optim.ema.PolicyEMA` of ``--ema_decay`` (None: off);
    ``layout`` is the parallel-layout record a resume checks (``sage_grpo.resume.layout_record``); ``config_yaml``
    gives the run's resolved configuration when a checkpoint is written (what a resume compares against); ``log``
    reports what a resume could not restore.
    """

    def __init__(self, *, models: CheckpointedModels, optimizer, kl_controller: Optional[Stateful],
                 anchor_schedule: MovingAnchorSchedule, counters: Stateful, dims: ParallelDims, run_dir: Path,
                 keep_checkpoints: int, layout: dict, config_yaml: Callable[[], str], log: Callable[[str], None],
                 ema: Optional[Stateful] = None):
        self.models, self.optimizer, self.ema = models, optimizer, ema
        self.optimizer_parts = optimizer_parts(optimizer)  # the torch optimizers by name: one DCP entry each
        self.kl_controller, self.anchor_schedule, self.counters = kl_controller, anchor_schedule, counters
        self.dims, self.run_dir, self.keep_checkpoints = dims, Path(run_dir), keep_checkpoints
        self.layout, self.config_yaml, self.log = layout, config_yaml, log

    # ------------------------------------------------------------------ save
    def save(self, step: int) -> Path:
        """Write ``checkpoint-{step}`` atomically, prune old ones (``keep_checkpoints``) and return its path."""
        import torch.distributed.checkpoint as dcp

        is_main, device = self.dims.is_main, self.dims.device
        final, tmp = self.run_dir / f"checkpoint-{step}", self.run_dir / f".checkpoint-{step}.tmp"
        training_state = self.training_state()
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(device)
        with_anchor = self.anchor_schedule.last_refreshed_at is not None  # until it moves, the anchor is the base
        if self.dims.is_distributed:
            dcp.save(self._dcp_state(with_anchor, self.ema is not None), checkpoint_id=str(tmp / DCP_DIR))
        model_state = gather_to_main(self.models.trainable_state_dict(), is_main)
        ema_state = gather_to_main(self.ema.state_dict(), is_main) if self.ema is not None else None
        if is_main:
            try:
                self._write_main_files(tmp, model_state, training_state, with_anchor, ema_state)
            except Exception as err:  # a full disk above all: nothing half-written stays, and its space is freed
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(err, DiskFullError):
                    raise disk_full_error(err.path, err.needed, f"{final.name} was not written and its partial "
                                          "files were removed; the earlier checkpoints are intact") from None
                raise
        del model_state, ema_state
        if is_main:
            fsync_tree(tmp)  # every rank's files are written and closed (DCP's save ends with a barrier)
        fault_point("checkpoint", step)
        barrier(device)
        if is_main:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            fsync_dir(self.run_dir)  # the rename itself survives a power loss
        barrier(device)
        if is_main:
            prune_checkpoints(self.run_dir, self.keep_checkpoints, current=step)
        return final

    def training_state(self) -> dict:
        """Counters, small stateful objects, layout and RNG states (on several processes a collective: it gathers
        every rank's RNG states)."""
        state = {**self.counters.state_dict(),
                 "kl_controller": self.kl_controller.state_dict() if self.kl_controller is not None else None,
                 "anchor_schedule": self.anchor_schedule.state_dict(), "layout": self.layout}
        if self.dims.is_distributed:
            state.update(rng_per_rank=gather_rng_states(), optimizer_parts=sorted(self.optimizer_parts))
        else:
            state["rng"] = capture_rng_state()
        return state

    def _write_main_files(self, directory: Path, model_state: StateDict, training_state: dict,
                          with_anchor: bool, ema_state: Optional[StateDict]) -> None:
        """Rank 0's files; on one process also the optimizer state and the anchor (several: in the DCP shards)."""
        one_process = not self.dims.is_distributed
        write_checkpoint_files(directory, model_state=model_state, training_state=training_state,
                               config_yaml=self.config_yaml(),
                               optimizer_state=self.optimizer.state_dict() if one_process else None,
                               anchor_state=self.models.reference_state() if one_process and with_anchor else None,
                               ema_state=ema_state)
        if not is_sharded(self.models.policy):
            # LoRA: the peft adapter folder lora/. It reads the adapter tensors whole, so FSDP-sharded runs skip it
            # (export_checkpoint then takes the adapter config from config.yaml).
            with disk_full_as_error(directory / LORA_DIR, nbytes_of(model_state) + (1 << 20)):
                self.models.save_extras(directory)

    def _dcp_state(self, with_anchor: bool, with_ema: bool) -> dict:
        """The nested state DCP saves or loads into (a collective: it initialises empty optimizer states)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {DCP_MODEL: dict(self.models.trainable_state_dict()),
                 DCP_OPTIMIZER: {name: get_optimizer_state_dict(self.models.policy, optimizer)
                                 for name, optimizer in self.optimizer_parts.items()}}
        if with_anchor:
            state[DCP_ANCHOR] = dict(self.models.reference_state())
        if with_ema:
            state[DCP_EMA] = dict(self.ema.state_dict())
        return state

    # ------------------------------------------------------------------ load
    def load(self, path: Path, training_state: dict) -> None:
        """Restore every object from ``path``, whose training state :func:`~sage_grpo.resume.check_resume` has read
        and checked. A run without a KL reference ignores a saved anchor."""
        path = Path(path)
        has_reference = self.models.reference is not None
        if is_sharded_checkpoint(path):
            self._load_dcp(path, training_state, has_reference)
        else:
            self._load_files(path, has_reference)
        # counters added later (the failed-reward streak, the drift guard's state) may be absent from an older run's
        self.counters.load_state_dict({key: training_state[key] for key in self.counters.state_dict()
                                       if key in training_state})
        if self.kl_controller is not None and training_state["kl_controller"] is not None:
            self.kl_controller.load_state_dict(training_state["kl_controller"])
        if has_reference:  # a run resumed without the KL has no anchor to schedule
            self.anchor_schedule.load_state_dict(training_state["anchor_schedule"])
        self._restore_rng(training_state)

    def roll_back(self, path: Path) -> None:
        """The drift guard's rollback: the weights, optimizer, KL controller and anchor of the run's own checkpoint
        ``path``, keeping the counters' state (the drift guard's with it) and this process's RNG states: the run goes
        on from its step (a collective on several processes, as :meth:`load`)."""
        training_state = load_plain(Path(path) / TRAINING_STATE_FILE, "training state")
        counters, rng = self.counters.state_dict(), capture_rng_state()
        self.load(path, training_state)
        self.counters.load_state_dict(counters)
        restore_rng_state(rng)

    def _load_files(self, path: Path, has_reference: bool) -> None:
        """A one-process checkpoint (plain data only, see :mod:`sage_grpo.safe_io`; weights and optimizer state
        finite: NaN weights would only show as NaN rewards and updates)."""
        self.models.load_trainable_state_dict(_finite(_load_safetensors(path / TRANSFORMER_FILE), path,
                                                      TRANSFORMER_FILE))
        self.optimizer.load_state_dict(_finite(load_plain(path / OPTIMIZER_FILE, "optimizer state"), path,
                                               OPTIMIZER_FILE))
        if has_reference and (path / ANCHOR_FILE).exists():
            self.models.load_reference_state(_finite(_load_safetensors(path / ANCHOR_FILE), path, ANCHOR_FILE))
        if self.ema is not None:
            self._restore_ema(_finite(_load_safetensors(path / EMA_FILE), path, EMA_FILE) if (path / EMA_FILE).exists()
                              else None, path)

    def _load_dcp(self, path: Path, training_state: dict, has_reference: bool) -> None:
        """A sharded checkpoint, in place on every rank and resharded to this layout (a collective)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        saved_parts = training_state.get("optimizer_parts")
        if saved_parts is not None and sorted(saved_parts) != sorted(self.optimizer_parts):
            raise ValueError(f"{path} holds optimizer states {sorted(saved_parts)} but this run builds "
                             f"{sorted(self.optimizer_parts)}; resume with the same --use_muon / --use_lora")
        stored = set(read_dcp_metadata(path / DCP_DIR).state_dict_metadata)
        with_anchor = has_reference and any(key.startswith(f"{DCP_ANCHOR}.") for key in stored)
        with_ema = self.ema is not None and any(key.startswith(f"{DCP_EMA}.") for key in stored)
        state = self._dcp_state(with_anchor, with_ema)
        expected = [f"{part}.{n}" for part in (DCP_MODEL, DCP_ANCHOR, DCP_EMA) for n in state.get(part, {})]
        missing = sorted(k for k in expected if k not in stored)
        if missing:
            raise KeyError(f"{path / DCP_DIR} lacks {len(missing)} weights of this model, e.g. {missing[:5]}")
        # Partial load: optimizer entries of parameters that never had a gradient are absent from the checkpoint and
        # keep their freshly initialised values; every weight was checked above.
        dcp_load(state, path / DCP_DIR, allow_partial_load=True)
        # NaN or inf weights or moments would only show as NaN rewards and updates (the one-process files are
        # checked the same way); every rank checks its shards and all stop together
        _finite_on_every_rank(state, str(path / DCP_DIR))
        # The weights were loaded in place; the bundle's loaders also check the keys (and mark a LoRA anchor ready).
        self.models.load_trainable_state_dict(state[DCP_MODEL])
        for name, optimizer in self.optimizer_parts.items():
            set_optimizer_state_dict(self.models.policy, optimizer, state[DCP_OPTIMIZER][name])
        if with_anchor:
            self.models.load_reference_state(state[DCP_ANCHOR])
        if self.ema is not None:
            self._restore_ema(state.get(DCP_EMA), path)

    def _restore_ema(self, state: Optional[StateDict], path: Path) -> None:
        """The EMA from the checkpoint; one without (EMA turned on at this resume) starts it from the weights."""
        if state is None:
            self.ema.reset()
            self.log(f"note: {path} holds no EMA (--ema_decay was 0); the EMA starts from its weights")
        else:
            self.ema.load_state_dict(state)

    def _restore_rng(self, training_state: dict) -> None:
        """This rank's global RNG states. After a change of world size the ranks keep their fresh ``seed + dp_rank``
        seeding (the trainer's own randomness comes from explicitly seeded generators and does not depend on it)."""
        if "rng" not in training_state and not training_state.get("rng_per_rank"):
            self.log("note: the checkpoint holds no RNG states; the global RNG states are not restored")
        elif "rng" in training_state or len(training_state["rng_per_rank"]) == self.dims.world_size:
            state = training_state["rng"] if "rng" in training_state else training_state["rng_per_rank"][self.dims.rank]
            for note in restore_rng_state(state):
                self.log(note)
        else:
            self.log(f"note: the checkpoint was written by {len(training_state['rng_per_rank'])} processes; global "
                     "RNG states are not restored")

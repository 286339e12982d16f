"""The :class:`CheckpointManager`: one object that saves and restores everything a run needs to continue exactly
(the layout of a checkpoint: :mod:`sage_grpo.checkpoint`)."""

import shutil
from pathlib import Path
from typing import Callable, Optional, Protocol

import torch
from torch.distributed.checkpoint.stateful import Stateful

from sage_grpo.checkpoint.files import (StateDict, finite_on_every_rank, finite_state, gather_to_main,
                                        is_sharded_checkpoint, load_safetensors, prune_checkpoints,
                                        write_checkpoint_files)
from sage_grpo.checkpoint.rng import capture_rng_state, gather_rng_states, restore_rng_state
from sage_grpo.checkpoint_layout import (ANCHOR_FILE, DCP_ANCHOR, DCP_DIR, DCP_EMA, DCP_MODEL, DCP_OPTIMIZER,
                                         EMA_FILE, LORA_DIR, OPTIMIZER_FILE, TRAINING_STATE_FILE, TRANSFORMER_FILE)
from sage_grpo.distributed.collectives import barrier
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.parallelize import is_sharded
from sage_grpo.faults import fault_point
from sage_grpo.optim.optimizers import optimizer_parts
from sage_grpo.rl.anchor import MovingAnchorSchedule
from sage_grpo.safe_io import (DiskFullError, dcp_load, disk_full_as_error, disk_full_error, fsync_dir, fsync_tree,
                               load_plain, nbytes_of, read_dcp_metadata)


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
        self.models.load_trainable_state_dict(finite_state(load_safetensors(path / TRANSFORMER_FILE), path,
                                                           TRANSFORMER_FILE))
        self.optimizer.load_state_dict(finite_state(load_plain(path / OPTIMIZER_FILE, "optimizer state"), path,
                                                    OPTIMIZER_FILE))
        if has_reference and (path / ANCHOR_FILE).exists():
            self.models.load_reference_state(finite_state(load_safetensors(path / ANCHOR_FILE), path, ANCHOR_FILE))
        if self.ema is not None:
            ema = path / EMA_FILE
            self._restore_ema(finite_state(load_safetensors(ema), path, EMA_FILE) if ema.exists() else None, path)

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
        finite_on_every_rank(state, str(path / DCP_DIR))
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

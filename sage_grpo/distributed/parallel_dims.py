"""Who is which rank, and the device meshes that say so (docs/reference.md#meshes-and-rank-layout,
docs/reference.md#layout-rules).

Layout: ``world = dp x sp`` and ``rank = dp_rank * sp + sp_rank``, so every sequence-parallel (SP) group is a block
of ``sp`` consecutive ranks (on one node whenever ``sp`` divides the GPUs per node). One "data-parallel replica" is
one SP group: its ranks see the same samples and, after sequence parallelism, hold the same velocities.

Meshes (built by :meth:`ParallelDims.build_meshes`, a collective call):

- ``world_mesh``: 2-D ``("dp", "sp") = [dp, sp]``; ``sp_group`` and ``dp_group`` are its two dimensions.
- ``fsdp_mesh``: with ``dp_replicate == 1`` (the reference's default) the flattened ``dp x sp`` mesh, i.e. FSDP
  shards over *all* ranks, SP ranks included; with ``dp_replicate = R > 1`` a 2-D HSDP mesh
  ``("dp_replicate", "dp_shard") = [R, world / R]`` (replicate over dim 0, shard over dim 1), as in the reference.
  FSDP2 averages gradients over every rank of this mesh. Under Ulysses each SP rank holds a *partial* gradient whose
  mean over its SP group is the replica's exact gradient (see ``sequence_parallel.py``), so that one mean is both the
  data-parallel average and the SP correction; no extra SP all-reduce is needed.
- ``prompt_group``: when a prompt group of ``G`` generations spans ``ranks_per_group = G / B > 1`` data-parallel
  ranks (docs/reference.md#prompt-data-and-the-sampler), the ranks with the same ``sp_rank`` in those DP ranks, for
  gathering the group's rewards.

Every layout rule (docs/reference.md#layout-rules) is one function of :mod:`sage_grpo.config.validation`, the same one
the config validator calls (rules 1-4 and heads % sp at construction; rule 5 per token count in
:meth:`ParallelDims.check_tokens`, a cached decision the SP hooks meet again as a lookup); failures raise
``ConfigError``. Constructing a ``ParallelDims`` needs no process group, so layouts can be checked (and tested) without
launching.
"""

from dataclasses import dataclass, field
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from sage_grpo.config.validation import (ConfigError, check_parallel_layout, check_sequence_parallel_tokens,
                                         group_layout)
from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.distributed.join import join_store
from sage_grpo.distributed.liveness import install_parent_death_signal

# The reference fork raises the NCCL timeout to two hours (reward scoring on SP leaders and checkpoint writes on rank 0
# keep the other ranks waiting in a collective for minutes); a stopped peer then froze the job that long. The trainer
# passes --collective_timeout_minutes (default 30, as here).
DEFAULT_PG_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistributedEnv:
    """What torchrun told this process."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def init_distributed(backend: Optional[str] = None, timeout: timedelta = DEFAULT_PG_TIMEOUT) -> DistributedEnv:
    """Read torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (checked before any connection,
    :func:`~sage_grpo.config.launch_env.read_launch_env`) and start the default process group once every rank has
    joined the job's store, waiting at most ``timeout`` for them (:func:`~sage_grpo.distributed.join.join_store`).

    Without torchrun's variables (``python post_train.py``) this is one process and no process group is created;
    with ``WORLD_SIZE=1`` neither. The backend defaults to NCCL on CUDA and gloo on CPU; on CUDA the current device is
    set to ``cuda:LOCAL_RANK`` first, so every later ``.cuda()`` lands on this process's GPU.
    """
    launch = read_launch_env(connecting=True)
    rank, world_size, local_rank = launch.rank, launch.world_size, launch.local_rank
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"[launch-env] LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} "
                              f"visible GPU(s). Fix: torchrun --nproc_per_node {torch.cuda.device_count()} (one "
                              "process per GPU), or make more GPUs visible (CUDA_VISIBLE_DEVICES).")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        install_parent_death_signal()  # a worker dies with its torchrun agent, never trains on as an orphan
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend=backend, timeout=timeout, store=join_store(launch, timeout),
                                rank=rank, world_size=world_size, device_id=device if device.type == "cuda" else None)
    return DistributedEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def destroy_distributed() -> None:
    """Tear down the default process group if this process started one."""
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class ParallelDims:
    """Degrees of parallelism, this rank's coordinates and (after :meth:`build_meshes`) the meshes.

    ``batch_size``/``num_generations`` (B, G) are optional: given, the batch layout rules (2)-(4) are checked too
    and ``prompt_group`` is built when a group spans several DP ranks.
    """

    world_size: int
    sp_size: int = 1
    dp_replicate: int = 1
    rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    batch_size: Optional[int] = None
    num_generations: Optional[int] = None
    num_attention_heads: Optional[int] = None

    _world_mesh: Optional[DeviceMesh] = field(default=None, init=False, repr=False)
    _fsdp_mesh: Optional[DeviceMesh] = field(default=None, init=False, repr=False)
    _prompt_mesh: Optional[DeviceMesh] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"[rank-in-world] rank {self.rank} is outside a world of {self.world_size} processes. "
                              "Fix: launch with torchrun, which sets RANK and WORLD_SIZE consistently.")
        batch_given = self.batch_size is not None and self.num_generations is not None
        # Rules (1) and heads % sp always; B = G = 1 makes rules (2)-(4) vacuous when no batch shape is given.
        check_parallel_layout(self.world_size, self.sp_size,
                              self.batch_size if batch_given else 1, self.num_generations if batch_given else 1,
                              self.num_attention_heads)
        if self.dp_replicate < 1 or self.world_size % self.dp_replicate:
            raise ConfigError(f"[dp-replicate-divides-world] --dp_replicate {self.dp_replicate} must divide the world "
                              f"size {self.world_size}. Fix: use --dp_replicate 1.")

    @classmethod
    def from_env(cls, env: DistributedEnv, sp_size: int, dp_replicate: int = 1, **sizes) -> "ParallelDims":
        return cls(world_size=env.world_size, sp_size=sp_size, dp_replicate=dp_replicate, rank=env.rank,
                   device=env.device, **sizes)

    # ---- coordinates: pure arithmetic, no process group needed ----
    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp_size

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp_size

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_sp_leader(self) -> bool:
        """sp_rank 0: the rank that scores rewards and writes per-replica files."""
        return self.sp_rank == 0

    @property
    def sp_leader_rank(self) -> int:
        """Global rank of this SP group's leader."""
        return self.dp_rank * self.sp_size

    @property
    def sp_group_ranks(self) -> List[int]:
        return list(range(self.sp_leader_rank, self.sp_leader_rank + self.sp_size))

    @property
    def ranks_per_group(self) -> int:
        """DP ranks a prompt group of G generations spans (1 when B >= G); needs batch_size and num_generations."""
        if self.batch_size is None or self.num_generations is None:
            raise ValueError("ParallelDims was built without batch_size/num_generations")
        return group_layout(self.batch_size, self.num_generations)[0]

    def check_tokens(self, num_tokens: int) -> None:
        """Rule (5): a video's latent token count must split evenly over the SP ranks."""
        check_sequence_parallel_tokens(num_tokens, self.sp_size)

    # ---- meshes: built once, collectively ----
    def build_meshes(self) -> None:
        """Create the meshes on every rank (a collective: call it at the same point on all ranks). No-op for world 1."""
        if not self.is_distributed or self._world_mesh is not None:
            return
        device_type = self.device.type
        self._world_mesh = init_device_mesh(device_type, (self.dp_size, self.sp_size), mesh_dim_names=("dp", "sp"))
        if self.dp_replicate == 1:
            self._fsdp_mesh = self._world_mesh["dp", "sp"]._flatten("dp_sp")
        else:
            self._fsdp_mesh = init_device_mesh(device_type, (self.dp_replicate, self.world_size // self.dp_replicate),
                                               mesh_dim_names=("dp_replicate", "dp_shard"))
        if self.batch_size is not None and self.num_generations is not None and self.ranks_per_group > 1:
            rpg = self.ranks_per_group
            self._prompt_mesh = init_device_mesh(device_type, (self.dp_size // rpg, rpg, self.sp_size),
                                                 mesh_dim_names=("prompt_group", "group_member", "sp"))

    def _require_meshes(self) -> None:
        if self.is_distributed and self._world_mesh is None:
            raise RuntimeError("call ParallelDims.build_meshes() on every rank before using meshes or groups")

    @property
    def world_mesh(self) -> Optional[DeviceMesh]:
        self._require_meshes()
        return self._world_mesh

    @property
    def fsdp_mesh(self) -> Optional[DeviceMesh]:
        """The mesh to pass to ``apply_fsdp`` (None on one process)."""
        self._require_meshes()
        return self._fsdp_mesh

    @property
    def sp_group(self) -> Optional[dist.ProcessGroup]:
        """This rank's SP group (None when sp_size is 1)."""
        self._require_meshes()
        return self._world_mesh["sp"].get_group() if self.sp_enabled else None

    @property
    def dp_group(self) -> Optional[dist.ProcessGroup]:
        """The ranks sharing this rank's sp_rank, one per replica (None when dp_size is 1)."""
        self._require_meshes()
        return self._world_mesh["dp"].get_group() if self.dp_size > 1 else None

    @property
    def prompt_group(self) -> Optional[dist.ProcessGroup]:
        """Same-sp_rank ranks of the DP ranks sharing one prompt group (None when a group fits on one DP rank)."""
        self._require_meshes()
        return self._prompt_mesh["group_member"].get_group() if self._prompt_mesh is not None else None

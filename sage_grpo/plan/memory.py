"""Memory plan of a launch: what lives on each GPU, phase by phase, and the placement decisions the ``auto`` flags leave
to it.

    python -m sage_grpo.plan --world_size 8 --gpu_memory_gb 80 <post_train.py flags>

prints (:mod:`sage_grpo.plan.report`) the per-GPU bytes by component for each phase of a step, the largest
``--batch_size``, ``--mini_batch_size_per_update`` and ``--sample_n_frames`` that fit, and ends with ``peak per GPU:
<GB> GB``. ``post_train.py`` runs the same plan before any model loads on CUDA devices and refuses a launch that does
not fit (``--ignore_memory_plan true`` goes on).

Units: GB here is 2^30 bytes, the unit ``torch.cuda`` reports (an "80 GB" H100 holds 79.2 of them).

The plan is computed in layers: the models' sizes and the activations' elements (:mod:`sage_grpo.plan.sizes`), the
bytes of each component on one GPU (:mod:`sage_grpo.plan.components`), the phases of a step
(:mod:`sage_grpo.plan.phases`, :func:`plan_memory`), and here the launch's decisions. The run's configuration enters
by shape (:class:`~sage_grpo.plan.options.PlanOptions`).

**Auto decisions** on CUDA (:func:`plan_launch`), each keeping ``MARGIN`` of the GPU free: the reference's shards stay
on the device when the plan fits with them there (no host transfers), else go to the CPU if
``--reference_mode_offload`` allows it (the reference's own switch for offloading; without it the plan reports that
the launch does not fit and names ``--reference_placement cpu``); then gradients are reduced once per update when the
plan still fits with the unsharded fp32 gradients held, else after every backward; last, what spends the memory left
on speed (:mod:`sage_grpo.plan.throughput`): the reward scored beside the reference pass (its forward then counts in
the reference phase), the replay group (the train phase's rows) and the largest reference batch that does not raise
the step's peak. Tiling: ``--vae_tiling auto`` tiles decodes above
:data:`~sage_grpo.models.placement.VAE_TILING_PIXELS`. A CPU device has no GPU budget: a sharded full fine-tune
reduces per backward, the reference stays with the model, its batch is ``--mini_batch_size_per_update`` (a larger one
changes the means in the last bits; the golden run is bit for bit), the replay group 1, the reward in the background
only from a reward server.
"""

import dataclasses
from typing import Optional, Tuple

import torch

from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.config.train import ParallelConfig
from sage_grpo.models.placement import Placement
from sage_grpo.plan.breakdown import GIB, Component, MemoryPlan, Phase  # noqa: F401 (API)
from sage_grpo.plan.components import AUTOCAST_ACTIVATION_FACTOR, RUNTIME_OVERHEAD_GIB, layout_of  # noqa: F401 (API)
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.phases import Step, plan_memory, step_plan  # noqa: F401 (API)
from sage_grpo.plan.scorers import needs_videoalign
from sage_grpo.plan.sizes import ModelSizes, read_model_sizes
from sage_grpo.plan.throughput import (ThroughputFlags, choose_throughput, off_cuda,  # noqa: F401 (API)
                                       reference_batch_candidates)

MARGIN = 0.10  # share of the GPU the auto decisions leave free: allocator fragmentation, NCCL buffers, the unplanned
DEFAULT_GPU_MEMORY_GIB = 80.0  # the CLI's budget when neither --gpu_memory_gb nor a GPU gives one


def _explicit(parallel: ParallelConfig) -> Tuple[Optional[bool], Optional[bool]]:
    """(reduce_per_backward, reference_on_cpu) the flags fix, None where ``auto``."""
    per_backward = None if parallel.gradient_reduction == "auto" else parallel.gradient_reduction == "per_backward"
    on_cpu = None if parallel.reference_placement == "auto" else parallel.reference_placement == "cpu"
    return per_backward, on_cpu


def plan_launch(cfg: PlanOptions, world_size: int, gpu_memory_gib: float,
                sizes: Optional[ModelSizes] = None) -> MemoryPlan:
    """The plan of ``cfg`` with its ``auto`` placements decided (see the module docstring)."""
    sizes = sizes or sizes_of(cfg)
    lay, step, parallel = layout_of(cfg, sizes, world_size, "cuda"), Step.of(cfg), cfg.parallel
    fixed_backward, fixed_cpu = _explicit(parallel)
    sharded = parallel.enable_fsdp and world_size > 1

    def planned(placement: Placement) -> MemoryPlan:
        return step_plan(lay, step, placement, gpu_memory_gib)

    def plan(per_backward: bool, on_cpu: bool) -> MemoryPlan:
        return planned(Placement(per_backward, on_cpu, parallel.vae_tiling, parallel.mini_batch_size_per_update))

    smallest_backward = fixed_backward if fixed_backward is not None else sharded and not cfg.lora.use_lora
    on_cpu = fixed_cpu
    if on_cpu is None:
        on_cpu = bool(parallel.reference_mode_offload and not plan(smallest_backward, False).fits(MARGIN))
    per_backward = fixed_backward
    if per_backward is None:
        per_backward = sharded and not plan(False, on_cpu).fits(MARGIN)
    return planned(choose_throughput(ThroughputFlags.of(cfg), plan(per_backward, on_cpu).placement, planned, MARGIN))


def sizes_of(cfg: PlanOptions) -> ModelSizes:
    return read_model_sizes(str(cfg.model.pretrained_model_root), cfg.model.pretrained_transformer_version,
                            needs_videoalign(cfg))


def resolve_placement(cfg: PlanOptions, *, sharded: bool, device_type: str,
                      plan: Optional[MemoryPlan] = None) -> Placement:
    """The placement of ``cfg`` for a run whose policy is FSDP-``sharded`` (or not) on ``device_type``.

    On CUDA the ``auto`` flags follow the memory plan (``plan``, or :func:`plan_launch` for this process group and
    GPU). Without a GPU budget (a CPU device): gradients are reduced per backward for a sharded full fine-tune
    (held unsharded fp32 gradients cost 4 bytes per parameter) and per update otherwise (LoRA gradients are small);
    the reference stays with the model unless ``--reference_placement cpu``.
    """
    if plan is None and device_type == "cuda":
        plan = plan_launch(cfg, launch_world_size(), device_memory_gib(cfg))
    # off CUDA, auto keeps the reference's batches: larger ones would change the numbers in the last bits (not
    # bit-identical on the CPU), and there is no GPU to fill (plan/throughput.py)
    if plan is not None:
        placement = plan.placement
        if device_type == "cuda":
            return placement
        return off_cuda(ThroughputFlags.of(cfg), dataclasses.replace(
            placement, reference_on_cpu=placement.reference_on_cpu and device_type != "cpu"))
    fixed_backward, fixed_cpu = _explicit(cfg.parallel)
    per_backward = fixed_backward if fixed_backward is not None else sharded and not cfg.lora.use_lora
    on_cpu = bool(fixed_cpu)  # --reference_placement cpu is honoured on a CPU device too (FSDP's CPU offload)
    return off_cuda(ThroughputFlags.of(cfg), Placement(reduce_per_backward=per_backward, reference_on_cpu=on_cpu,
                                                       vae_tiling=cfg.parallel.vae_tiling))


def placement_of(cfg: PlanOptions, device: torch.device) -> Placement:
    """The run's memory placement on ``device``, handed to the model builder."""
    from sage_grpo.models.bundle import is_sharded_run

    return resolve_placement(cfg, sharded=is_sharded_run(cfg), device_type=device.type)


def launch_world_size() -> int:
    """The processes of this launch: the process group's size, else ``$WORLD_SIZE``, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return read_launch_env().world_size


def device_memory_gib(cfg: PlanOptions) -> float:
    """``--gpu_memory_gb``, else this process's GPU's memory, else :data:`DEFAULT_GPU_MEMORY_GIB`."""
    if cfg.parallel.gpu_memory_gb is not None:
        return cfg.parallel.gpu_memory_gb
    if torch.cuda.is_available():
        index = torch.device(cfg.parallel.device).index if cfg.parallel.device else None
        if index is None:  # no --device, or a bare "cuda": this process's GPU, as resolve_device picks it
            index = read_launch_env().local_rank
        return torch.cuda.get_device_properties(index).total_memory / GIB
    return DEFAULT_GPU_MEMORY_GIB

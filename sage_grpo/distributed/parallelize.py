"""Parallelizing the trainer's models from outside them (docs/reference.md#parallel-execution): the one place that
decides how the policy and the KL reference are split over the ranks, and how their gradients are reduced and clipped.

:func:`parallelize_models` applies, in place and in this order,

1. Ulysses sequence parallelism (:func:`~sage_grpo.distributed.sequence_parallel.apply_sequence_parallel`) over the SP
   group, to the policy *and* the reference: both are called with identical inputs on every rank of an SP group, so
   both split the image tokens (the reference does the same through its global parallel state);
2. with ``--enable_fsdp`` and more than one process, FSDP2 over ``ParallelDims.fsdp_mesh``:

   - policy: :func:`~sage_grpo.distributed.fsdp.apply_fsdp` with ``param_dtype`` from :func:`policy_param_dtype`
     (``--dtype`` by default: bf16 gathers of the fp32 master weights; the reference gathers fp32), fp32 gradient
     reduction and activation checkpointing from ``--enable_gradient_checkpointing``;
   - reference (frozen): the same wrapping units, no cast, no checkpointing; with ``--reference_mode_offload`` its
     shards live on the CPU (``CPUOffloadPolicy``) and FSDP copies each block's shards to the GPU for its all-gather.

Moving anchor: policy and reference are sharded identically (same mesh, same units, same dim-0 placements), so
``ModelBundle.copy_policy_to_reference`` (``reference.load_state_dict(policy.state_dict())``) copies DTensor shard to
DTensor shard, locally on every rank, casting to the reference dtype: no rank ever gathers the full model. The
reference's implementation gathers the full policy on every rank, and with an FSDP reference its copy fails
silently (docs/reference.md#d16).

Departure from the reference: with ``--reference_mode_offload`` the reference moves the whole bf16 model to each GPU
for its passes and is never sharded; here it is sharded *and* offloaded, so a rank holds 1/world of it in CPU memory
and about one block at a time (FSDP's prefetch) on the GPU.

Gradients: FSDP averages over every rank of its mesh, which is both the data-parallel mean and the Ulysses
correction (see ``sequence_parallel.py``). Without FSDP on several processes, :func:`average_unsharded_gradients`
does that mean explicitly (one all-reduce per parameter, once per optimizer update). :func:`clip_gradients` clips by
the global norm, gathering the norm of DTensor gradients (the only communication is one scalar).

Clip threshold (:func:`clip_threshold`): the gradient here is the full gradient at every SP degree, the reference's
norm is 1/sp of its norm (its all-gathers' backward gives each SP rank only its own slice and FSDP then averages over
the SP ranks too; its direction differs for the text queries, docs/differences.md), so its ``--max_grad_norm m``
clips where the full gradient's norm is m·sp. With ``--max_grad_norm_units
reference`` (default) ``--max_grad_norm`` means the reference's number and the full gradient is clipped at m·sp, so
``run_post_train.sh``'s flags and the paper configs clip where the reference does at every SP degree; ``full`` clips
the full gradient at m (one process then reproduces an SP run with the same flags).
"""

from typing import List, Optional, Protocol

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from sage_grpo.config.train.model import LoRAConfig, ModelConfig, ParallelConfig
from sage_grpo.config.train.objective import OptimConfig
from sage_grpo.distributed.collectives import average_gradients
from sage_grpo.distributed.fsdp import apply_fsdp
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.sequence_parallel import apply_sequence_parallel
from sage_grpo.dtypes import DTYPES


# ---------------------------------------------------------------- wrapping

def is_sharded(model: Optional[torch.nn.Module]) -> bool:
    return isinstance(model, FSDPModule)


def shard_frozen(model: torch.nn.Module, mesh, *, offload: bool) -> torch.nn.Module:
    """FSDP2 on a frozen transformer with the policy's units (:func:`apply_fsdp`), no cast, optional CPU offload."""
    config = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy())
    if offload:
        config["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in model.transformer_blocks:
        fully_shard(block, **config)
    fully_shard(model.context_embedder, **config)
    fully_shard(model, **config)
    return model


class PrecisionOptions(Protocol):
    """What the policy's gathered dtype is decided from: the model, LoRA and parallel sections (declared by shape)."""

    model: ModelConfig
    lora: LoRAConfig
    parallel: ParallelConfig


def policy_param_dtype(cfg: PrecisionOptions) -> torch.dtype:
    """Dtype of the policy's all-gathered (compute) weights, ``--fsdp_param_dtype``; ``auto`` is ``--dtype``.

    Full fine-tune: the master weights stay in ``--master_weight_type`` (fp32) and are gathered in ``--dtype``
    (bf16 at the reference launch), FSDP2's mixed precision. The forward already runs under ``--dtype`` autocast,
    which rounds every fp32 weight to bf16 at its matmul: gathered in bf16 the rounding happens once in the
    all-gather instead (half the traffic), and autocast no longer keeps a bf16 copy of every gathered fp32 weight for
    the whole forward (its weight cache; 2 bytes per parameter, 16.6 GB for the 8.3B model). The reference gathers
    fp32 (``--fsdp_param_dtype fp32``).

    LoRA: ``--dtype``, where the frozen base already is (only the adapters are in the master dtype). Casting the bf16
    base up to fp32 would double its traffic, and FSDP2 units mixing a cast bf16 base with uncast fp32 adapters made the
    training forward differ from the rollout's after the first backward (ratio != 1 on-policy on the tiny model); with
    no cast of the base both agree bit for bit."""
    if cfg.lora.use_lora or cfg.parallel.fsdp_param_dtype == "auto":
        return DTYPES[cfg.model.dtype]
    return DTYPES[cfg.parallel.fsdp_param_dtype]


def parallelize_models(bundle, dims: ParallelDims, parallel: ParallelConfig, param_dtype: torch.dtype) -> None:
    """SP, then FSDP2 when ``--enable_fsdp`` and world > 1, on ``bundle.policy``, ``bundle.reference`` and the drift
    proxy's frozen ``bundle.base`` (in place; the base like the reference). ``parallel``: the configuration's
    parallel section; ``param_dtype``: the policy's gathered dtype (:func:`policy_param_dtype`).

    Call on every rank after ``dims.build_meshes()`` and before building the optimizer.
    """
    frozen = [m for m in (bundle.separate_reference, bundle.base) if m is not None]  # LoRA's reference: the policy
    for model in (bundle.policy, *frozen):
        apply_sequence_parallel(model, dims.sp_group)
    if not (dims.is_distributed and parallel.enable_fsdp):
        return
    apply_fsdp(bundle.policy, dims.fsdp_mesh, param_dtype=param_dtype, reduce_dtype=torch.float32,
               activation_checkpointing=parallel.enable_gradient_checkpointing)
    for model in frozen:
        shard_frozen(model, dims.fsdp_mesh, offload=bundle.placement.reference_on_cpu)
    bundle.materialize()  # transformers built on the meta device: read each rank's shards now


# ---------------------------------------------------------------- gradients

def average_unsharded_gradients(params: List[torch.nn.Parameter], dims: ParallelDims) -> None:
    """Mean over all ranks of plain gradients (several processes without FSDP); no-op when FSDP already reduced."""
    if dims.is_distributed and not any(isinstance(p, DTensor) for p in params):
        average_gradients(params, dist.group.WORLD)


def clip_threshold(optim: OptimConfig, sp_size: int) -> float:
    """The norm of the full gradient at which it is clipped: ``--max_grad_norm`` in ``--max_grad_norm_units``
    (``optim``: the configuration's optimizer section) at SP degree ``sp_size``."""
    return optim.max_grad_norm * (sp_size if optim.max_grad_norm_units == "reference" else 1)


def clip_gradients(params: List[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` (same two steps, so bit-identical on plain tensors) with the global norm of DTensor shards.

    Returns the total norm (a plain 0-d tensor) before clipping.
    """
    grads = [p.grad for p in params if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()  # the norm of the shards' partial norms: one scalar all-reduce
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm, foreach=True)
    return total_norm

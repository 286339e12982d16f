"""Parallelizing the trainer's models from outside them (reference_spec §3): the one place that decides how the policy
and the KL reference are split over the ranks, and how their gradients are reduced and clipped.

:func:`parallelize_models` applies, in place and in this order,

1. Ulysses sequence parallelism (:func:`~sage_grpo.distributed.sequence_parallel.apply_sequence_parallel`) over the SP
   group, to the policy *and* the reference: both are called with identical inputs on every rank of an SP group, so
   both split the image tokens (the reference does the same through its global parallel state);
2. with ``--enable_fsdp`` and more than one process, FSDP2 over ``ParallelDims.fsdp_mesh``:

   - policy: :func:`~sage_grpo.distributed.fsdp.apply_fsdp` with ``param_dtype = --master_weight_type`` (the master
     weights are already in that dtype, so the default fp32 all-gathers do not down-cast, as in the reference; with
     LoRA ``--dtype``, see :func:`policy_param_dtype`), fp32 gradient reduction and activation checkpointing from
     ``--enable_gradient_checkpointing``;
   - reference (frozen): the same wrapping units, no cast, no checkpointing; with ``--reference_mode_offload`` its
     shards live on the CPU (``CPUOffloadPolicy``) and FSDP copies each block's shards to the GPU for its all-gather.

Moving anchor: policy and reference are sharded identically (same mesh, same units, same dim-0 placements), so
``ModelBundle.copy_policy_to_reference`` (``reference.load_state_dict(policy.state_dict())``) copies DTensor shard to
DTensor shard, locally on every rank, casting to the reference dtype: no rank ever gathers the full model. The
reference's implementation gathers the full policy on every rank, and with an FSDP reference its copy fails
silently (spec §10.16).

Departure from the reference: with ``--reference_mode_offload`` the reference moves the whole bf16 model to each GPU
for its passes and is never sharded; here it is sharded *and* offloaded, so a rank holds 1/world of it in CPU memory
and about one block at a time (FSDP's prefetch) on the GPU.

Gradients: FSDP averages over every rank of its mesh, which is both the data-parallel mean and the Ulysses
correction (see ``sequence_parallel.py``). Without FSDP on several processes, :func:`average_unsharded_gradients`
does that mean explicitly (one all-reduce per parameter, once per optimizer update). :func:`clip_gradients` clips by
the global norm, gathering the norm of DTensor gradients (the only communication is one scalar).
"""

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from sage_grpo.config import TrainConfig
from sage_grpo.config.validation import parse_size, rollout_size
from sage_grpo.distributed.collectives import average_gradients
from sage_grpo.distributed.fsdp import apply_fsdp
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.sequence_parallel import apply_sequence_parallel
from sage_grpo.models import layout

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# ---------------------------------------------------------------- checks before any model loads

def _read_config(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def video_tokens(vae_config: dict, transformer_config: dict, num_frames: int, height: int, width: int) -> int:
    """Image tokens of one video in the transformer: the VAE's latent (T, h, w) divided by the patch sizes."""
    latent_frames = (num_frames - 1) // vae_config["temporal_compression_ratio"] + 1
    spatial = vae_config["spatial_compression_ratio"]
    patch, patch_t = transformer_config.get("patch_size", 1), transformer_config.get("patch_size_t", 1)
    return (latent_frames // patch_t) * (height // spatial // patch) * (width // spatial // patch)


@dataclass(frozen=True)
class ModelGeometry:
    """What the parallel layout rules need from the model, read from its config files (no weights loaded)."""

    num_attention_heads: int
    video_tokens: Dict[str, int]  # "rollout" (and "validation" when validation runs) -> image tokens per video


def read_model_geometry(cfg: TrainConfig) -> Optional[ModelGeometry]:
    """The geometry of the configured checkpoint; None when a config file is missing (the loader then reports every
    missing file of the checkpoint at once)."""
    root = Path(cfg.pretrained_model_root)
    transformer = _read_config(root / layout.transformer_layout(cfg.pretrained_transformer_version).subdir
                               / "config.json")
    vae = _read_config(root / layout.VAE.subdir / "config.json")
    if transformer is None or vae is None:
        return None
    height, width = rollout_size(cfg)
    tokens = {"rollout": video_tokens(vae, transformer, cfg.sample_n_frames, height, width)}
    if cfg.validation_interval > 0 or cfg.validate_at_step0:
        size = parse_size(cfg.validation_fixed_size, "--validation_fixed_size") or (height, width)
        tokens["validation"] = video_tokens(vae, transformer, cfg.validate_video_length, *size)
    return ModelGeometry(transformer["num_attention_heads"], tokens)


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


def policy_param_dtype(cfg: TrainConfig) -> torch.dtype:
    """Dtype of the policy's all-gathered (compute) weights: ``--master_weight_type`` for a full fine-tune (the
    weights are all in it), ``--dtype`` with LoRA, where the frozen base stays in ``--dtype`` and only the adapters are
    in the master dtype. Casting the bf16 base up to fp32 in the all-gather would double its traffic, and FSDP2 units
    mixing a cast bf16 base with uncast fp32 adapters made the training forward differ from the rollout's after the
    first backward (ratio != 1 on-policy on the tiny model); with no cast of the base both agree bit for bit."""
    return DTYPES[cfg.dtype] if cfg.use_lora else DTYPES[cfg.master_weight_type]


def parallelize_models(bundle, dims: ParallelDims, cfg: TrainConfig) -> None:
    """SP, then FSDP2 when ``--enable_fsdp`` and world > 1, on ``bundle.policy`` and ``bundle.reference`` (in place).

    Call on every rank after ``dims.build_meshes()`` and before building the optimizer.
    """
    reference = bundle.separate_reference  # with LoRA the reference is the policy itself: wrapped once
    for model in (bundle.policy, reference):
        if model is not None:
            apply_sequence_parallel(model, dims.sp_group)
    if not (dims.is_distributed and cfg.enable_fsdp):
        return
    apply_fsdp(bundle.policy, dims.fsdp_mesh, param_dtype=policy_param_dtype(cfg), reduce_dtype=torch.float32,
               activation_checkpointing=cfg.enable_gradient_checkpointing)
    if reference is not None:
        shard_frozen(reference, dims.fsdp_mesh, offload=cfg.reference_mode_offload)


@contextlib.contextmanager
def reference_on_device(bundle) -> Iterator[torch.nn.Module]:
    """The reference ready for its passes: FSDP moves a sharded (and possibly offloaded) reference module by itself;
    otherwise ``ModelBundle.reference_on_device`` (whole-model moves with ``--reference_mode_offload``, or the policy
    switched to its reference adapters with LoRA)."""
    if is_sharded(bundle.separate_reference):
        yield bundle.separate_reference
    else:
        with bundle.reference_on_device() as reference:
            yield reference


# ---------------------------------------------------------------- gradients

def average_unsharded_gradients(params: List[torch.nn.Parameter], dims: ParallelDims) -> None:
    """Mean over all ranks of plain gradients (several processes without FSDP); no-op when FSDP already reduced."""
    if dims.is_distributed and not any(isinstance(p, DTensor) for p in params):
        average_gradients(params, dist.group.WORLD)


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

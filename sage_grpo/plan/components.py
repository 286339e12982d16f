"""The components of a memory plan: what each holds on one GPU, in bytes, as a formula of the launch's layout.

**Model sizes** are exact (counted on the ``meta`` device) and the activation and decode formulas are counted save by
save, in :mod:`sage_grpo.plan.sizes`; this module turns them into bytes per GPU, and :mod:`sage_grpo.plan.phases`
puts them in the phases of a step.

**Symbols** (per GPU): P transformer parameters, P_g those that get a gradient (all but the last block's unused
text-stream outputs), P_mat the trained 2-D matrices (Muon), P_blk one dual-stream block, P_root the parameters of the
root FSDP unit (embedders, output layers); W world size, Z = W / dp_replicate the FSDP shard degree (1 without FSDP),
sp the Ulysses degree; m, g, c the bytes of the master dtype (``--master_weight_type``), of the all-gathered compute
weights and of ``--dtype``; a = c bytes per activation element, times ``AUTOCAST_ACTIVATION_FACTOR`` (measured) when
the forward runs under autocast; b the samples per transformer call (``--mini_batch_size_per_update``, doubled when
``--cfg_scale`` > 1: both CFG branches run in one call). Tokens: L latent tokens of a video, n = L / sp image tokens
per SP rank, T = L_mllm + L_byt5 + L_image text tokens (replicated on every SP rank), S = L + T the attention
sequence; D hidden, F MLP hidden, H heads, h_d head dim.

**Components** (each a formula below): policy weights P·m/Z (they are the master weights: no second copy); Muon
momentum P_mat·m/Z plus AdamW's two moments 2·(P_g − P_mat)·m/Z; gradients P_g·m/Z sharded (``per_backward``) or P_g·4
unsharded fp32 held across an update's backwards (``per_update``, plus the first reduced block's shard); the step's
inputs (rollout latents, prompt embeddings, from the reference pass on the KL reference's means); FSDP's
gathered units in flight P_root·g + 2·P_blk·g (the unit computing and the one prefetched) plus the last block's
unsharded fp32 gradient (the first reduced, at the start of the backward where the peak is); autocast copies P·2 (bf16
casts of every fp32 weight, cached by autocast for the whole forward) when the compute runs under autocast on fp32
weights; activations per block (:func:`~sage_grpo.plan.sizes.block_saved_elements`, counted save by save and checked
against the tensors autograd saves on the tiny model, ``tests/unit/test_plan.py``); the reference's bf16 shards P·c/Z
on the device, or about two blocks while it runs from the CPU, and the same for the drift proxy's frozen base copy
(``--drift_proxy`` without LoRA or a fixed anchor); the text encoders (only while encoding when offloaded);
the rollout's SDE noise (drawn up front, one latent per stochastic step); the VAE weights and its decode (tiled or
not); the reward models and their forward on SP leaders, the held-out validation scorers on rank 0
(:mod:`sage_grpo.plan.scorers`); the EMA of ``--ema_decay``, P·4/Z (LoRA: the policy adapter's r·Σ(in+out)·4/Z).
LoRA: the frozen base P·c/Z and every adapter (the anchor's too) in m; P_g the adapters that get a gradient, no reduced
shard (the peak is the end of the last block's recomputation); no separate reference: its passes run the policy (the
anchor adapter, or none), gathering the policy's units.
"""

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from sage_grpo import rl
from sage_grpo.config.train import LoRAConfig, OptimConfig
from sage_grpo.dtypes import DTYPES, autocast_dtype_of
from sage_grpo.models.placement import Placement
from sage_grpo.plan.breakdown import GIB, Component
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.scorers import Scorers, resident_rows
from sage_grpo.plan.sizes import (ModelSizes, TextTokens, TransformerSizes, lora_in_blocks_only,
                                  no_grad_forward_elements, rope_table_elements, vae_decode_bytes)

RUNTIME_OVERHEAD_GIB = 2.0  # CUDA context (~0.5 GB), NCCL/gloo buffers and the caching allocator's slack
# Under autocast (bf16 compute on fp32 weights) norms, softmax statistics and some products stay fp32, so a forward
# saves more than its element count times 2 bytes: measured 1.30x without and 1.17x with checkpointing on the tiny
# model under CPU autocast (tests/unit/test_plan.py). Activation bytes are elements x c x this factor under autocast.
AUTOCAST_ACTIVATION_FACTOR = 1.25


@dataclass(frozen=True)
class Layout:
    """The numbers every formula needs, decided once from the configuration (:func:`layout_of`)."""

    sizes: ModelSizes
    world_size: int
    shard: int  # Z
    sp: int
    master: int  # m
    gathered: int  # g
    compute: int  # c
    activation: float  # bytes per activation element: c, times AUTOCAST_ACTIVATION_FACTOR under autocast
    autocast_copies: bool
    separate_reference: bool
    trainable: int  # P_g
    offload_encoders: bool
    kl: rl.KLMode  # the run's KL mode (sage_grpo.rl.kl_mode_of)
    adapters: int  # LoRA: every adapter's parameters, the anchor's too (r·Σ(in+out) each); 0 without LoRA
    block_trainable: int  # the last block's trained parameters (not its unused text outputs): FSDP reduces it first
    base_copy: bool  # the drift proxy's frozen base transformer, placed like the reference (rl.drift_guard)
    lora: LoRAConfig  # --use_lora, --lora_r
    optim: OptimConfig  # --use_muon, --ema_decay, --gradient_accumulation_steps
    rows: int  # --mini_batch_size_per_update: samples per transformer call before CFG
    cfg_batch: bool  # --cfg_scale > 1: both CFG branches in one call
    text: TextTokens
    frozen_outside: bool  # LoRA in the blocks only: nothing outside them saves for backward
    scorers: Scorers

    @property
    def gradients_persist(self) -> bool:
        """Gradients outlive the training phase when an update spans several rollout batches."""
        return self.optim.gradient_accumulation_steps > 1


def layout_of(cfg: PlanOptions, sizes: ModelSizes, world_size: int, device_type: str) -> Layout:
    """The :class:`Layout` of the run ``cfg`` on ``world_size`` GPUs of ``device_type``."""
    from sage_grpo.distributed.parallelize import policy_param_dtype

    sharded = cfg.parallel.enable_fsdp and world_size > 1
    t, lora = sizes.transformer, cfg.lora
    gathered = policy_param_dtype(cfg).itemsize if sharded else DTYPES[cfg.model.master_weight_type].itemsize
    compute = DTYPES[cfg.model.dtype].itemsize
    kl, r, per_block = rl.kl_mode_of(cfg.trust_region), lora.lora_r, t.lora_width // t.config["num_layers"]
    # P_g: parameters that get a gradient (and optimizer state)
    trainable = r * (t.lora_width - t.unused_lora_width) if lora.use_lora else t.num_params - t.unused_params
    autocast = autocast_dtype_of(cfg) is not None  # the transformer's forward runs under autocast
    return Layout(
        sizes=sizes, world_size=world_size, shard=world_size // cfg.parallel.dp_replicate if sharded else 1,
        sp=cfg.parallel.sp_size, master=DTYPES[cfg.model.master_weight_type].itemsize, gathered=gathered,
        compute=compute, activation=compute * (AUTOCAST_ACTIVATION_FACTOR if autocast else 1.0),
        autocast_copies=autocast and not lora.use_lora and compute < gathered,
        separate_reference=kl.uses_reference and not lora.use_lora, trainable=trainable,
        offload_encoders=cfg.parallel.offload_text_encoders and device_type != "cpu",
        kl=kl, adapters=r * t.lora_width * (2 if kl.moving_anchor else 1) if lora.use_lora else 0,
        block_trainable=r * (per_block - t.unused_lora_width) if lora.use_lora else t.block_params - t.unused_params,
        base_copy=rl.drift_watch_of(cfg.drift, cfg.validation.validation_interval, lora.use_lora, kl).base_copy,
        lora=lora, optim=cfg.optim, rows=cfg.parallel.mini_batch_size_per_update, cfg_batch=cfg.rollout.cfg_scale > 1,
        text=TextTokens.of(cfg.model), frozen_outside=lora_in_blocks_only(lora), scorers=Scorers.of(cfg))


def resident(lay: Layout, placement: Placement) -> List[Component]:
    """What stays on the GPU through every phase."""
    t, z, lora = lay.sizes.transformer, lay.shard, lay.lora
    out = [_policy_weights(lay)] + _optimizer_state(lay)
    for held, name in ((lay.separate_reference, "reference (KL anchor)"), (lay.base_copy, "frozen base (drift proxy)")):
        if held and not placement.reference_on_cpu:
            out.append(Component(f"{name} shards", t.num_params * lay.compute / z, "P·c/Z, on the device"))
    out.append(Component("VAE weights", lay.sizes.vae_params * lay.compute, "resident in --dtype"))
    out += [Component(*row) for row in resident_rows(lay.scorers, lay.sizes, lay.compute)]  # rewards, held-out scorers
    if lay.optim.ema_decay > 0:  # every trainable tensor (LoRA: the policy adapter's) in fp32, sharded like the weights
        ema = lora.lora_r * t.lora_width if lora.use_lora else t.num_params
        out.append(Component("EMA of the trained weights", ema * 4 / z, f"{_count_text(ema)}·4/Z, --ema_decay"))
    if not lay.offload_encoders:
        out.append(encoder_weights(lay, "resident (--offload_text_encoders false)"))
    if lay.gradients_persist:
        out.append(gradients(lay, placement, "kept across the accumulation window's rollouts"))
    out.append(Component("runtime overhead", RUNTIME_OVERHEAD_GIB * GIB, "CUDA context, NCCL buffers, allocator slack"))
    return out


def _policy_weights(lay: Layout) -> Component:
    t, z = lay.sizes.transformer, lay.shard
    if lay.lora.use_lora:
        return Component("policy weights (frozen base + LoRA)", (t.num_params * lay.compute + lay.adapters
                                                                 * lay.master) / z,
                         f"P·c/Z + k·r·Σ(in+out)·m/Z, k adapters (the anchor too), Z = {z}")
    return Component("policy weights = fp32 master shards" if lay.master == 4 else "policy weight shards",
                     t.num_params * lay.master / z, f"P·m/Z = {_count_text(t.num_params)}·{lay.master}/{z}")


def _optimizer_state(lay: Layout) -> List[Component]:
    t, z = lay.sizes.transformer, lay.shard
    if not lay.optim.use_muon:
        return [Component("optimizer: AdamW moments", 2 * lay.trainable * lay.master / z, "2·P_g·m/Z")]
    matrices = lay.trainable if lay.lora.use_lora else t.num_matrix_params
    return [Component("optimizer: Muon momentum", matrices * lay.master / z, "P_mat·m/Z (2-D weights)"),
            Component("optimizer: AdamW moments", 2 * (lay.trainable - matrices) * lay.master / z,
                      "2·(P_g − P_mat)·m/Z (biases, norms, the patch conv)")]


def _count_text(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"


def encoder_weights(lay: Layout, note: str) -> Component:
    return Component("text encoders (Qwen2.5-VL + byT5)",
                     (lay.sizes.text_encoder_params + lay.sizes.byt5_params) * lay.compute, note)


def gradients(lay: Layout, placement: Placement, note: str = "") -> Component:
    if lay.shard > 1 and not placement.reduce_per_backward:  # + the first reduced (last) block's shard at the peak,
        first = "" if lay.lora.use_lora else " + (P_blk − P_unused)·4/Z"  # which LoRA's peak precedes (docstring)
        return Component("gradients (unsharded, held per update)",
                         lay.trainable * 4 + (0 if lay.lora.use_lora else lay.block_trainable * 4 / lay.shard),
                         f"P_g·4{first}: fp32, reduced once per update {note}".strip())
    return Component("gradients (sharded)" if lay.shard > 1 else "gradients", lay.trainable * lay.master / lay.shard,
                     f"P_g·m/Z {note}".strip())


def gathered_units(lay: Layout, dtype_bytes: int, with_gradient: bool) -> List[Component]:
    """FSDP's unsharded units in flight: the root (kept through forward and backward), the block computing and the
    one prefetched (with LoRA, its adapters), and in the backward one block's unsharded fp32 gradient before its
    reduce-scatter."""
    t = lay.sizes.transformer
    if lay.shard == 1:
        return []
    block = t.block_params + lay.adapters // t.config["num_layers"]
    out = [Component("FSDP gathered units", (t.root_params + 2 * block) * dtype_bytes,
                     f"(P_root + 2·P_blk)·{dtype_bytes}")]
    if with_gradient:  # at the peak, the start of the backward: the last block's, whose unused outputs get none
        out.append(Component("FSDP unsharded block gradient", lay.block_trainable * 4,
                             "(P_blk − P_unused)·4: the last block's, before its reduce-scatter"))
    return out


def autocast_copies(lay: Layout) -> List[Component]:
    if not lay.autocast_copies:
        return []
    return [Component("autocast bf16 weight copies", lay.sizes.transformer.num_params * lay.compute,
                      "P·2: autocast caches a bf16 cast of each fp32 weight for the whole forward")]


def calls(lay: Layout, steps: int = 1) -> int:
    """b: samples per transformer call (both CFG branches in one call), ``steps`` trained steps of each."""
    return lay.rows * steps * (2 if lay.cfg_batch else 1)


def no_grad_forward(lay: Layout, name: str, video_tokens: int, samples: Optional[int] = None,
                    adapters_active: Optional[bool] = None) -> Component:
    """A no-grad forward on ``samples`` rows (default ``--mini_batch_size_per_update``), both CFG branches: its live
    tensors at its peak (:func:`no_grad_forward_elements`), c bytes each (nothing is saved, so autocast's fp32 saves
    do not arise), plus the fp32 RoPE tables. ``adapters_active``: default ``--use_lora``."""
    t = lay.sizes.transformer
    b = calls(lay) if samples is None else samples * (2 if lay.cfg_batch else 1)
    active = lay.lora.use_lora if adapters_active is None else adapters_active
    elements = no_grad_forward_elements(t, video_tokens, lay.text, lay.sp, lay.cfg_batch, active)
    return Component(name, b * elements * lay.compute + rope_table_elements(t, video_tokens) * 4,
                     f"b·[L·D + max(3nD + 2nF, 4nD + 2TF) + 3TD + 3(T+L_img)·D + ...]·c + 2·L·h_d·4, b = {b}")


def optimizer_step(lay: Layout, placement: Placement) -> List[Component]:
    """The optimizer step: the reduced (sharded) gradients and the larger of its two optimizers' temporaries.

    Muon (:class:`sage_grpo.optim.muon.Muon`) takes one matrix at a time: the gathered update of the largest trained
    matrix (r x c, master dtype), Newton-Schulz's old and new iterates (2·r·c in bf16, a GPU's iteration dtype) and
    its Gram matrix and polynomial (2·min(r, c)² bf16). AdamW on a GPU runs torch's foreach
    implementation: one temporary list the size of the shards it steps (its ``_foreach_sqrt`` of the second moments).
    The global-norm clip adds only scalars (``plan/tracking.py``).
    """
    t, z, m = lay.sizes.transformer, lay.shard, lay.master
    out = [] if lay.gradients_persist else [gradients(lay, dataclasses.replace(placement, reduce_per_backward=True))]
    if lay.lora.use_lora and lay.optim.use_muon:
        return out + [Component("optimizer step temporaries", lora_muon_step_bytes(t, lay.lora.lora_r, m),
                                "Muon, LoRA: r·c·(m + 2·2) + r·D·2 + 2·r²·2, c the widest layer side")]
    if not lay.optim.use_muon:
        return out + [Component("optimizer step temporaries", lay.trainable * m / z,
                                "P_g·m/Z: foreach AdamW's sqrt of the second moments")]
    rows, cols = t.largest_matrix
    muon = rows * cols * (m + 2 * 2) + 2 * min(rows, cols) ** 2 * 2
    adamw = (lay.trainable - t.num_matrix_params) * m / z
    return out + [Component("optimizer step temporaries", max(muon, adamw),
                            f"max(Muon: r·c·(m + 2·2) + 2·min(r,c)²·2, r x c = {rows} x {cols}; AdamW: "
                            "(P_g − P_mat)·m/Z)")]


def lora_muon_step_bytes(t: TransformerSizes, r: int, master_bytes: int) -> int:
    """Muon's temporaries on LoRA adapters (every adapter tensor is a matrix, one at a time): the largest is r x c, c
    the widest side of the blocks' layers (the modulation's 6·D output), in the master dtype, with Newton-Schulz's
    two bf16 iterates and its r² Gram matrix and polynomial (the step drops each matrix's gathered update before the
    next one's; checked on the simulated step, ``sage_grpo/plan/simulate.py``)."""
    c = t.largest_linear_side
    return r * c * (master_bytes + 2 * 2) + 2 * r * r * 2


def vae_decode(lay: Layout, placement: Placement, frames: int, height: int, width: int, name: str) -> Component:
    """Decode of one video (:func:`vae_decode_bytes`) and the fp32 copy of it that ``decode_latents`` makes."""
    tiled = placement.tile(frames, height, width)
    decode = vae_decode_bytes(lay.sizes.vae_config, frames, height, width, lay.compute, tiled)
    formula = "max(6·C·F·256² + tiles so far, tiles + 2 videos)·c" if tiled else "6·C·F·H·W·c"
    return Component(f"{name} ({'tiled' if tiled else 'untiled'})", decode + 3 * frames * height * width * 4,
                     f"{formula}, {frames}×{height}×{width}")


def encode(lay: Layout, batch: int) -> Component:
    """Prompt encoding of a step's ``batch`` prompts (+ the negative): every hidden state of the MLLM is returned (the
    pipeline takes the third from last), plus one layer's transient."""
    layers, hidden, intermediate = lay.sizes.text_encoder_shape
    prompts = batch + 1
    return Component("prompt encoding activations", prompts * lay.text.total * ((layers + 1) * hidden
                     + 4 * hidden + 3 * intermediate) * lay.compute, "prompts·tokens·((layers+1)·h + 4h + 3i)·c")


def prompt_embeddings(lay: Layout, batch: int) -> Component:
    """The step's prompt embeddings as the trainer keeps them: ``batch`` rows, positive and negative, of both streams
    (L_mllm·E1 + L_byt5·E2 in ``--dtype``) and their int64 masks."""
    config, text = lay.sizes.transformer.config, lay.text
    per_row = (text.mllm * config["text_embed_dim"] + text.byt5 * config["text_embed_2_dim"]) * lay.compute \
        + text.total * 8
    return Component("prompt embeddings", 2 * batch * per_row,
                     "2·B·(L_mllm·E1 + L_byt5·E2)·c + int64 masks: positive and negative")


def frozen_units(lay: Layout, placement: Placement, name: str) -> Component:
    """A frozen transformer's (the reference's, the base copy's) weights in flight during its forward."""
    t = lay.sizes.transformer
    if placement.reference_on_cpu:
        units = 2 * t.block_params + t.root_params if lay.shard > 1 else t.num_params
        return Component(f"{name} from the CPU", units * lay.compute, "its gathered units (whole model unsharded)")
    return Component(f"{name} gathered units", (t.root_params + 2 * t.block_params) * lay.compute
                     if lay.shard > 1 else 0.0, "(P_root + 2·P_blk)·c")

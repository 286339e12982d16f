"""Memory plan of a launch: what lives on each GPU, phase by phase, and the placement decisions the ``auto`` flags leave
to it.

    python -m sage_grpo.plan --world_size 8 --gpu_memory_gb 80 <post_train.py flags>

prints (:mod:`sage_grpo.plan.report`) the per-GPU bytes by component for each phase of a step, the largest
``--batch_size``, ``--mini_batch_size_per_update`` and ``--sample_n_frames`` that fit, and ends with ``peak per GPU:
<GB> GB``. ``post_train.py`` runs the same plan before any model loads on CUDA devices and refuses a launch that does
not fit (``--ignore_memory_plan true`` goes on).

Units: GB here is 2^30 bytes, the unit ``torch.cuda`` reports (an "80 GB" H100 holds 79.2 of them).

**Model sizes** are exact (counted on the ``meta`` device) and the activation and decode formulas are counted save by
save, in :mod:`sage_grpo.plan.sizes`; this module turns them into bytes per GPU and decides the placements.

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

**Phases**: encode (text encoders), rollout (policy, no grad), reference (KL means, no grad), train (forward +
backward), optimizer step (:func:`_optimizer_step`), decode + reward, validation (sampling, decode, scoring, the drift
proxy's base forwards). The peak is the largest phase. Every transformer phase is checked category by category against
torch's memory tracker on fake tensors (``--simulate``, :mod:`sage_grpo.plan.simulate`).

**Auto decisions** on CUDA (:func:`plan_launch`), each keeping ``MARGIN`` of the GPU free: the reference's shards stay
on the device when the plan fits with them there (no host transfers), else go to the CPU if
``--reference_mode_offload`` allows it (the reference's own switch for offloading; without it the plan reports that
the launch does not fit and names ``--reference_placement cpu``); then gradients are reduced once per update when the
plan still fits with the unsharded fp32 gradients held, else after every backward; last, what spends the memory left
on speed (:mod:`sage_grpo.plan.throughput`): the reward scored beside the reference pass (its forward then counts in
the reference phase), the replay group (the train phase's rows) and the largest reference batch that does not raise
the step's peak. Tiling: ``--vae_tiling auto`` tiles decodes above :data:`~sage_grpo.models.placement.VAE_TILING_PIXELS`. A CPU device has no
GPU budget: a sharded full fine-tune reduces per backward, the reference stays with the model, its batch is
``--mini_batch_size_per_update`` (a larger one changes the means in the last bits; the golden run is bit for bit), the
replay group 1, the reward in the background only from a reward server.
"""

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from sage_grpo.config.train import TrainConfig
from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.config.validation import rollout_size, validation_size
from sage_grpo.models.placement import Placement
from sage_grpo.plan.scorers import needs_videoalign, resident_rows, reward_forward_row, validation_scoring_row
from sage_grpo.plan.sizes import (ModelSizes, lora_muon_step_bytes, no_grad_forward_elements, prompt_embedding_bytes,
                                  read_model_sizes, rope_table_elements, text_token_count, training_activation_elements,
                                  vae_decode_bytes, video_token_count)
from sage_grpo.plan.throughput import choose_throughput, off_cuda, reference_batch_candidates  # noqa: F401 (API)

GIB = 2 ** 30
MARGIN = 0.10  # share of the GPU the auto decisions leave free: allocator fragmentation, NCCL buffers, the unplanned
RUNTIME_OVERHEAD_GIB = 2.0  # CUDA context (~0.5 GB), NCCL/gloo buffers and the caching allocator's slack
DEFAULT_GPU_MEMORY_GIB = 80.0  # the CLI's budget when neither --gpu_memory_gb nor a GPU gives one
# Under autocast (bf16 compute on fp32 weights) norms, softmax statistics and some products stay fp32, so a forward
# saves more than its element count times 2 bytes: measured 1.30x without and 1.17x with checkpointing on the tiny
# model under CPU autocast (tests/unit/test_plan.py). Activation bytes are elements x c x this factor under autocast.
AUTOCAST_ACTIVATION_FACTOR = 1.25


# ====================================================================== the plan

@dataclass(frozen=True)
class Component:
    name: str
    bytes: float
    note: str = ""


@dataclass(frozen=True)
class Phase:
    name: str
    components: Tuple[Component, ...]

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.components)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU bytes of every phase of a step for one placement; ``peak`` is the largest phase."""

    phases: Tuple[Phase, ...]
    placement: Placement
    gpu_memory_gib: float
    notes: Tuple[str, ...] = ()

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak_gib(self) -> float:
        return self.peak.bytes / GIB

    def fits(self, margin: float = 0.0) -> bool:
        return self.peak_gib <= self.gpu_memory_gib * (1.0 - margin)

    def phase(self, name: str) -> Optional[Phase]:
        return next((p for p in self.phases if p.name == name), None)


@dataclass(frozen=True)
class _Layout:
    """The numbers every formula needs, decided once from the configuration."""

    cfg: TrainConfig
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
    kl: object  # the run's KLMode (sage_grpo.rl.kl_mode_of)
    adapters: int  # LoRA: every adapter's parameters, the anchor's too (r·Σ(in+out) each); 0 without LoRA
    block_trainable: int  # the last block's trained parameters (not its unused text outputs): FSDP reduces it first
    base_copy: bool  # the drift proxy's frozen base transformer, placed like the reference (rl.drift_guard)


def _layout(cfg: TrainConfig, sizes: ModelSizes, world_size: int, device_type: str) -> _Layout:
    from sage_grpo.distributed.parallelize import policy_param_dtype
    from sage_grpo.dtypes import DTYPES, autocast_dtype_of
    from sage_grpo.rl import drift_watch_of, kl_mode_of

    sharded = cfg.parallel.enable_fsdp and world_size > 1
    t = sizes.transformer
    gathered = policy_param_dtype(cfg).itemsize if sharded else DTYPES[cfg.model.master_weight_type].itemsize
    compute = DTYPES[cfg.model.dtype].itemsize
    kl, r, per_block = kl_mode_of(cfg.trust_region), cfg.lora.lora_r, t.lora_width // t.config["num_layers"]
    # P_g: parameters that get a gradient (and optimizer state)
    trainable = r * (t.lora_width - t.unused_lora_width) if cfg.lora.use_lora else t.num_params - t.unused_params
    autocast = autocast_dtype_of(cfg) is not None  # the transformer's forward runs under autocast
    return _Layout(
        cfg=cfg, sizes=sizes, world_size=world_size, shard=world_size // cfg.parallel.dp_replicate if sharded else 1,
        sp=cfg.parallel.sp_size, master=DTYPES[cfg.model.master_weight_type].itemsize, gathered=gathered, compute=compute,
        activation=compute * (AUTOCAST_ACTIVATION_FACTOR if autocast else 1.0),
        autocast_copies=autocast and not cfg.lora.use_lora and compute < gathered,
        separate_reference=kl.uses_reference and not cfg.lora.use_lora, trainable=trainable,
        offload_encoders=cfg.parallel.offload_text_encoders and device_type != "cpu",
        kl=kl, adapters=r * t.lora_width * (2 if kl.moving_anchor else 1) if cfg.lora.use_lora else 0,
        block_trainable=r * (per_block - t.unused_lora_width) if cfg.lora.use_lora else t.block_params - t.unused_params,
        base_copy=drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl).base_copy)


def _resident(lay: _Layout, placement: Placement) -> List[Component]:
    """What stays on the GPU through every phase."""
    cfg, t, z = lay.cfg, lay.sizes.transformer, lay.shard
    out = []
    if cfg.lora.use_lora:
        out.append(Component("policy weights (frozen base + LoRA)", (t.num_params * lay.compute + lay.adapters
                                                                     * lay.master) / z,
                             f"P·c/Z + k·r·Σ(in+out)·m/Z, k adapters (the anchor too), Z = {z}"))
    else:
        out.append(Component("policy weights = fp32 master shards" if lay.master == 4 else "policy weight shards",
                             t.num_params * lay.master / z, f"P·m/Z = {_count_text(t.num_params)}·{lay.master}/{z}"))
    if cfg.optim.use_muon:
        matrices = lay.trainable if cfg.lora.use_lora else t.num_matrix_params
        out.append(Component("optimizer: Muon momentum", matrices * lay.master / z, "P_mat·m/Z (2-D weights)"))
        out.append(Component("optimizer: AdamW moments", 2 * (lay.trainable - matrices) * lay.master / z,
                             "2·(P_g − P_mat)·m/Z (biases, norms, the patch conv)"))
    else:
        out.append(Component("optimizer: AdamW moments", 2 * lay.trainable * lay.master / z, "2·P_g·m/Z"))
    for held, name in ((lay.separate_reference, "reference (KL anchor)"), (lay.base_copy, "frozen base (drift proxy)")):
        if held and not placement.reference_on_cpu:
            out.append(Component(f"{name} shards", t.num_params * lay.compute / z, "P·c/Z, on the device"))
    out.append(Component("VAE weights", lay.sizes.vae_params * lay.compute, "resident in --dtype"))
    out += [Component(*row) for row in resident_rows(cfg, lay.sizes, lay.compute)]  # rewards, held-out scorers
    if cfg.optim.ema_decay > 0:  # every trainable tensor (the policy adapter's with LoRA) in fp32, sharded like the weights
        ema = cfg.lora.lora_r * t.lora_width if cfg.lora.use_lora else t.num_params
        out.append(Component("EMA of the trained weights", ema * 4 / z, f"{_count_text(ema)}·4/Z, --ema_decay"))
    if not lay.offload_encoders:
        out.append(_encoder_weights(lay, "resident (--offload_text_encoders false)"))
    if _gradients_persist(cfg):
        out.append(_gradients(lay, placement, "kept across the accumulation window's rollouts"))
    out.append(Component("runtime overhead", RUNTIME_OVERHEAD_GIB * GIB, "CUDA context, NCCL buffers, allocator slack"))
    return out


def _count_text(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"


def _encoder_weights(lay: _Layout, note: str) -> Component:
    return Component("text encoders (Qwen2.5-VL + byT5)",
                     (lay.sizes.text_encoder_params + lay.sizes.byt5_params) * lay.compute, note)


def _gradients_persist(cfg: TrainConfig) -> bool:
    """Gradients outlive the training phase when an update spans several rollout batches."""
    return cfg.optim.gradient_accumulation_steps > 1


def _gradients(lay: _Layout, placement: Placement, note: str = "") -> Component:
    if lay.shard > 1 and not placement.reduce_per_backward:  # + the first reduced (last) block's shard at the peak,
        first = "" if lay.cfg.lora.use_lora else " + (P_blk − P_unused)·4/Z"  # which LoRA's peak precedes (docstring)
        return Component("gradients (unsharded, held per update)",
                         lay.trainable * 4 + (0 if lay.cfg.lora.use_lora else lay.block_trainable * 4 / lay.shard),
                         f"P_g·4{first}: fp32, reduced once per update {note}".strip())
    return Component("gradients (sharded)" if lay.shard > 1 else "gradients", lay.trainable * lay.master / lay.shard,
                     f"P_g·m/Z {note}".strip())


def _gathered_units(lay: _Layout, dtype_bytes: int, with_gradient: bool) -> List[Component]:
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


def _autocast(lay: _Layout) -> List[Component]:
    if not lay.autocast_copies:
        return []
    return [Component("autocast bf16 weight copies", lay.sizes.transformer.num_params * lay.compute,
                      "P·2: autocast caches a bf16 cast of each fp32 weight for the whole forward")]


def _calls(cfg: TrainConfig, steps: int = 1) -> int:
    """b: samples per transformer call (both CFG branches in one call), ``steps`` trained steps of each."""
    return cfg.parallel.mini_batch_size_per_update * steps * (2 if cfg.rollout.cfg_scale > 1 else 1)


def _no_grad_forward(lay: _Layout, name: str, video_tokens: int, samples: Optional[int] = None,
                     adapters_active: Optional[bool] = None) -> Component:
    """A no-grad forward on ``samples`` rows (default ``--mini_batch_size_per_update``), both CFG branches: its live
    tensors at its peak (:func:`no_grad_forward_elements`), c bytes each (nothing is saved, so autocast's fp32 saves
    do not arise), plus the fp32 RoPE tables."""
    t = lay.sizes.transformer
    b = _calls(lay.cfg) if samples is None else samples * (2 if lay.cfg.rollout.cfg_scale > 1 else 1)
    elements = no_grad_forward_elements(t, video_tokens, lay.cfg, lay.sp, lay.cfg.rollout.cfg_scale > 1, adapters_active)
    return Component(name, b * elements * lay.compute + rope_table_elements(t, video_tokens) * 4,
                     f"b·[L·D + max(3nD + 2nF, 4nD + 2TF) + 3TD + 3(T+L_img)·D + ...]·c + 2·L·h_d·4, b = {b}")


def _optimizer_step(lay: _Layout, placement: Placement) -> List[Component]:
    """The optimizer step: the reduced (sharded) gradients and the larger of its two optimizers' temporaries.

    Muon (:class:`sage_grpo.optim.muon.Muon`) takes one matrix at a time: the gathered update of the largest trained
    matrix (r x c, master dtype), Newton-Schulz's old and new iterates (2·r·c in bf16, a GPU's iteration dtype) and
    its Gram matrix and polynomial (2·min(r, c)² bf16). AdamW on a GPU runs torch's foreach
    implementation: one temporary list the size of the shards it steps (its ``_foreach_sqrt`` of the second moments).
    The global-norm clip adds only scalars (``plan/tracking.py``).
    """
    cfg, t, z, m = lay.cfg, lay.sizes.transformer, lay.shard, lay.master
    out = [] if _gradients_persist(cfg) else [_gradients(lay, dataclasses.replace(placement,
                                                                                  reduce_per_backward=True))]
    if cfg.lora.use_lora and cfg.optim.use_muon:
        return out + [Component("optimizer step temporaries", lora_muon_step_bytes(t, cfg.lora.lora_r, m),
                                "Muon, LoRA: r·c·(m + 2·2) + r·D·2 + 2·r²·2, c the widest layer side")]
    if not cfg.optim.use_muon:
        return out + [Component("optimizer step temporaries", lay.trainable * m / z,
                                "P_g·m/Z: foreach AdamW's sqrt of the second moments")]
    rows, cols = t.largest_matrix
    muon = rows * cols * (m + 2 * 2) + 2 * min(rows, cols) ** 2 * 2
    adamw = (lay.trainable - t.num_matrix_params) * m / z
    return out + [Component("optimizer step temporaries", max(muon, adamw),
                            f"max(Muon: r·c·(m + 2·2) + 2·min(r,c)²·2, r x c = {rows} x {cols}; AdamW: "
                            "(P_g − P_mat)·m/Z)")]


def _vae_decode(lay: _Layout, placement: Placement, frames: int, height: int, width: int, name: str) -> Component:
    """Decode of one video (:func:`vae_decode_bytes`) and the fp32 copy of it that ``decode_latents`` makes."""
    tiled = placement.tile(frames, height, width)
    decode = vae_decode_bytes(lay.sizes.vae_config, frames, height, width, lay.compute, tiled)
    formula = "max(6·C·F·256² + tiles so far, tiles + 2 videos)·c" if tiled else "6·C·F·H·W·c"
    return Component(f"{name} ({'tiled' if tiled else 'untiled'})", decode + 3 * frames * height * width * 4,
                     f"{formula}, {frames}×{height}×{width}")


def _beside_reference(row) -> Component:
    """The reward's forward (a :mod:`~sage_grpo.plan.scorers` row) in the reference phase (``--async_reward``)."""
    name, nbytes, formula = row
    return Component(f"{name} beside it (--async_reward)", nbytes, formula)


def _encode(lay: _Layout) -> Component:
    """Prompt encoding of a step's prompts (+ the negative): every hidden state of the MLLM is returned (the
    pipeline takes the third from last), plus one layer's transient."""
    layers, hidden, intermediate = lay.sizes.text_encoder_shape
    prompts = lay.cfg.data.batch_size + 1
    tokens = text_token_count(lay.cfg)
    return Component("prompt encoding activations", prompts * tokens * ((layers + 1) * hidden
                     + 4 * hidden + 3 * intermediate) * lay.compute, "prompts·tokens·((layers+1)·h + 4h + 3i)·c")


def plan_memory(cfg: TrainConfig, sizes: ModelSizes, world_size: int, gpu_memory_gib: float,
                placement: Placement, device_type: str = "cuda") -> MemoryPlan:
    """The per-GPU plan of ``cfg`` on ``world_size`` GPUs for a fixed ``placement``."""
    lay = _layout(cfg, sizes, world_size, device_type)
    t = sizes.transformer
    height, width = rollout_size(cfg)
    tokens = video_token_count(sizes, cfg.rollout.sample_n_frames, height, width)
    resident = _resident(lay, placement)
    policy_units = _gathered_units(lay, lay.gathered, with_gradient=False)
    phases = []
    if lay.offload_encoders:
        phases.append(Phase("encode", tuple(resident + [_encoder_weights(lay, "on the GPU only while encoding"),
                                                        _encode(lay)])))
    latents = cfg.data.batch_size * (cfg.rollout.grpo_sampling_steps + 1) * sizes.vae_config["latent_channels"] * (
        tokens * t.config["patch_size"] ** 2 * t.config["patch_size_t"]) * 4
    step_inputs = [Component("rollout latents x_0..x_N", latents, "B·(N+1)·latent·4"),
                   Component("prompt embeddings", prompt_embedding_bytes(t, cfg, lay.compute),
                             "2·B·(L_mllm·E1 + L_byt5·E2)·c + int64 masks: positive and negative")]
    # the rollout's SDE noise, moved to the device in one copy (pipeline/rollout.py): one latent per stochastic step
    sde_steps = cfg.rollout.sde_window_size or cfg.rollout.grpo_sampling_steps
    sde_noise = Component("rollout SDE noise", latents // (cfg.rollout.grpo_sampling_steps + 1) * sde_steps,
                          "B·N_sde·latent·4, N_sde = --sde_window_size or N")
    phases.append(Phase("rollout", tuple(resident + policy_units + _autocast(lay) + step_inputs + [sde_noise]
                                         + [_no_grad_forward(lay, "rollout block activations", tokens)])))
    means = [Component("reference means", latents // (cfg.rollout.grpo_sampling_steps + 1) * cfg.rollout.grpo_sampling_steps,
                       "B·N·latent·4: reference pass to optimizer step")] if lay.kl.uses_reference else []
    # LoRA: the reference passes run the policy itself, its units gathered as for the rollout
    if lay.separate_reference or (cfg.lora.use_lora and lay.kl.uses_reference):
        ref = [_frozen_units(lay, placement, "reference")] if lay.separate_reference else policy_units
        reward = [_beside_reference(reward_forward_row(cfg, sizes))] if placement.async_reward else []
        phases.append(Phase("reference", tuple(resident + ref + step_inputs + means + reward + [
                                                           _no_grad_forward(lay, "reference block activations",
                                                                            tokens, placement.reference_batch_size,
                                                                            cfg.lora.use_lora and lay.kl.moving_anchor)])))
    b = _calls(cfg, placement.replay_group_size)
    kept, saved = training_activation_elements(t, tokens, cfg, lay.sp, cfg.parallel.enable_gradient_checkpointing)
    train = resident + _gathered_units(lay, lay.gathered, with_gradient=placement.reduce_per_backward) + _autocast(lay)
    if not _gradients_persist(cfg):
        train.append(_gradients(lay, placement))
    train += step_inputs + means + [Component(
        "activations" + (" (checkpointed)" if cfg.parallel.enable_gradient_checkpointing else ""),
        b * (kept * lay.compute + saved * lay.activation),
        ("b·((blocks·(n+T) + L − n + L_img)·D·c + (one block + outside)·a), "
         if cfg.parallel.enable_gradient_checkpointing else "b·(blocks·block + outside)·a, ")
        + f"b = {b}, n = {tokens // lay.sp}, T = {text_token_count(cfg)}, a = {lay.activation:g} B")]
    phases.append(Phase("train", tuple(train)))
    phases.append(Phase("optimizer step", tuple(resident + step_inputs + means + _optimizer_step(lay, placement))))
    phases.append(Phase("decode + reward", tuple(resident + step_inputs + [
        _vae_decode(lay, placement, cfg.rollout.sample_n_frames, height, width, "VAE decode"),
        Component(*reward_forward_row(cfg, sizes))])))
    if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0:
        v_height, v_width = validation_size(cfg)
        v_tokens = video_token_count(sizes, cfg.validation.validate_video_length, v_height, v_width)
        phases.append(Phase("validation sampling", tuple(
            resident + policy_units + _autocast(lay) + [_no_grad_forward(lay, "validation block activations",
                                                                         v_tokens)])))
        phases.append(Phase("validation decode", tuple(resident + [_vae_decode(
            lay, placement, cfg.validation.validate_video_length, v_height, v_width, "validation VAE decode")])))
        phases.append(Phase("validation scoring", tuple(resident + [Component(*validation_scoring_row(
            cfg, sizes, lay.compute))])))
        if lay.base_copy:  # the drift proxy's base forwards (LoRA's and a fixed anchor's base: no model of its own)
            phases.append(Phase("drift proxy", tuple(resident + [_frozen_units(lay, placement, "frozen base"),
                                                                 _no_grad_forward(lay, "drift proxy activations",
                                                                                  v_tokens)])))
    return MemoryPlan(tuple(phases), placement, gpu_memory_gib)


def _frozen_units(lay: _Layout, placement: Placement, name: str) -> Component:
    """A frozen transformer's (the reference's, the base copy's) weights in flight during its forward."""
    t = lay.sizes.transformer
    if placement.reference_on_cpu:
        units = 2 * t.block_params + t.root_params if lay.shard > 1 else t.num_params
        return Component(f"{name} from the CPU", units * lay.compute, "its gathered units (whole model unsharded)")
    return Component(f"{name} gathered units", (t.root_params + 2 * t.block_params) * lay.compute
                     if lay.shard > 1 else 0.0, "(P_root + 2·P_blk)·c")


# ====================================================================== decisions

def _explicit(cfg: TrainConfig) -> Tuple[Optional[bool], Optional[bool]]:
    """(reduce_per_backward, reference_on_cpu) the flags fix, None where ``auto``."""
    per_backward = None if cfg.parallel.gradient_reduction == "auto" else cfg.parallel.gradient_reduction == "per_backward"
    on_cpu = None if cfg.parallel.reference_placement == "auto" else cfg.parallel.reference_placement == "cpu"
    return per_backward, on_cpu


def plan_launch(cfg: TrainConfig, world_size: int, gpu_memory_gib: float,
                sizes: Optional[ModelSizes] = None) -> MemoryPlan:
    """The plan of ``cfg`` with its ``auto`` placements decided (see the module docstring)."""
    sizes = sizes or sizes_of(cfg)
    fixed_backward, fixed_cpu = _explicit(cfg)
    sharded = cfg.parallel.enable_fsdp and world_size > 1

    def plan(per_backward: bool, on_cpu: bool) -> MemoryPlan:
        return plan_memory(cfg, sizes, world_size, gpu_memory_gib,
                           Placement(per_backward, on_cpu, cfg.parallel.vae_tiling, cfg.parallel.mini_batch_size_per_update))

    smallest_backward = fixed_backward if fixed_backward is not None else sharded and not cfg.lora.use_lora
    on_cpu = fixed_cpu
    if on_cpu is None:
        on_cpu = bool(cfg.parallel.reference_mode_offload and not plan(smallest_backward, False).fits(MARGIN))
    per_backward = fixed_backward
    if per_backward is None:
        per_backward = sharded and not plan(False, on_cpu).fits(MARGIN)
    def planned(placement: Placement) -> MemoryPlan:
        return plan_memory(cfg, sizes, world_size, gpu_memory_gib, placement)

    return planned(choose_throughput(cfg, plan(per_backward, on_cpu).placement, planned, MARGIN))


def sizes_of(cfg: TrainConfig) -> ModelSizes:
    return read_model_sizes(str(cfg.model.pretrained_model_root), cfg.model.pretrained_transformer_version, needs_videoalign(cfg))


def resolve_placement(cfg: TrainConfig, *, sharded: bool, device_type: str,
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
        return off_cuda(cfg, dataclasses.replace(placement, reference_on_cpu=placement.reference_on_cpu
                                                 and device_type != "cpu"))
    fixed_backward, fixed_cpu = _explicit(cfg)
    per_backward = fixed_backward if fixed_backward is not None else sharded and not cfg.lora.use_lora
    on_cpu = bool(fixed_cpu)  # --reference_placement cpu is honoured on a CPU device too (FSDP's CPU offload)
    return off_cuda(cfg, Placement(reduce_per_backward=per_backward, reference_on_cpu=on_cpu, vae_tiling=cfg.parallel.vae_tiling))


def placement_of(cfg: TrainConfig, device: torch.device) -> Placement:
    """The run's memory placement on ``device``, handed to the model builder."""
    from sage_grpo.models.bundle import is_sharded_run

    return resolve_placement(cfg, sharded=is_sharded_run(cfg), device_type=device.type)


def launch_world_size() -> int:
    """The processes of this launch: the process group's size, else ``$WORLD_SIZE``, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return read_launch_env().world_size


def device_memory_gib(cfg: TrainConfig) -> float:
    """``--gpu_memory_gb``, else this process's GPU's memory, else :data:`DEFAULT_GPU_MEMORY_GIB`."""
    if cfg.parallel.gpu_memory_gb is not None:
        return cfg.parallel.gpu_memory_gb
    if torch.cuda.is_available():
        index = torch.device(cfg.parallel.device).index if cfg.parallel.device else None
        if index is None:  # no --device, or a bare "cuda": this process's GPU, as resolve_device picks it
            index = read_launch_env().local_rank
        return torch.cuda.get_device_properties(index).total_memory / GIB
    return DEFAULT_GPU_MEMORY_GIB

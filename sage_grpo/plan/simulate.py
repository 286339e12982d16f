"""A GRPO step executed without a GPU: the real transformer classes at the launch's size, the project's own Ulysses,
FSDP2, checkpointing and autocast, run on fake tensors over a fake process group, with torch's FSDP memory tracker
and FLOP counter watching each phase (``python -m sage_grpo.plan <flags> --simulate``).

How: one process joins a ``fake`` process group of ``--world_size`` ranks as rank 0 and builds the meshes of
:class:`~sage_grpo.distributed.parallel_dims.ParallelDims`; the policy (``--master_weight_type``) and the KL
reference (``--dtype``) are built on the ``meta`` device from the transformer config the planner reads
(:func:`sage_grpo.plan.memory.sizes_of`); with ``--use_lora`` the policy is the frozen ``--dtype`` base with the
trainer's adapters (:func:`sage_grpo.models.bundle.build_lora`: peft, the moving anchor a second adapter) and no
reference model (its phase runs the policy through ``LoraTraining.reference_mode``). They get the joint attention,
SP, FSDP2 and checkpointing of :func:`~sage_grpo.distributed.parallelize.parallelize_models`, and are materialised
with ``to_empty`` inside ``FakeTensorMode``: every tensor has its shape, dtype and device and no storage, so 54
blocks at 81 x 352 x 624 run on a laptop's memory. :class:`FSDPMemTracker` (with two corrections,
:mod:`sage_grpo.plan.tracking`) attributes every live byte to a category (sharded and unsharded parameters,
gradients, all-gather and reduce-scatter buffers, optimizer state, activations, temporaries, inputs) and keeps the
breakdown at the phase's peak; a dispatch mode with torch's FLOP formulas counts the phase's FLOPs on this rank's
shapes.

What fake mode cannot run, and where it is worked around:

- FSDP2 on a ``cuda`` mesh asks the CUDA runtime for its current device (``torch.cuda.current_device``), which a
  CPU-only torch does not have: the simulation runs on the ``cpu`` device type. Shapes and dtypes are the same; the
  CUDA caching allocator's rounding and fragmentation, NCCL's buffers and the attention kernels' workspaces are not
  seen (the plan's ``runtime overhead`` and its margin cover them, see :data:`UNSEEN`).
- The transformer runs the trainer's own forward (``sage_grpo/models/transformer_forward.py``), which takes the text
  layout from the host instead of reading it off the device (diffusers' forward asks ``torch.all(image_embeds == 0)``
  and reorders the text by boolean masks, data-dependent questions fake tensors cannot answer). The simulation's
  prompts have every MLLM and byT5 slot valid (the planner's worst case), so the blocks see T = L_mllm + L_byt5 text
  tokens, as ``sage_grpo.plan.sizes.text_token_count`` assumes; with the CFG rows split
  (``--mixed_length_attention``, as CUDA decides it) the negative prompt has a few valid slots and its row attends
  in calls of its own, as in a run; with the mask kept, both rows are fully valid and need none (a masked call would
  run SDPA's math kernel on fake CPU tensors, which saves the S x S scores a GPU's masked kernels do not).
- Offloaded reference shards (``--reference_placement cpu``) live on the CPU and cannot be told apart from the
  device's on a CPU-only run: the simulation keeps them in place and leaves their bytes out of the device's tally.

Phases not executed (named in the output, with the reason): prompt encoding, VAE decode and the reward (other model
families: their memory is the planner's estimate), checkpoint save (host memory and disk, not the GPU).
"""

import contextlib
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from sage_grpo.config import TrainConfig
from sage_grpo.plan.tracking import (GROUPS, Phase, SimulatedPhase, forward_only_module_tracking,
                                     metadata_only_propagation, without)

GIB = 2 ** 30
NEGATIVE_VALID_TOKENS = 8  # valid text slots of the empty negative prompt (the MLLM template), the split CFG row's
# What the simulation cannot see on a CPU-only fake run; the planner's "runtime overhead" and margin stand for it.
UNSEEN = ("CUDA caching-allocator rounding and fragmentation", "NCCL communicator buffers",
          "flash/cuDNN attention workspaces and kernels' own temporaries", "the CUDA context")


@dataclass
class Simulation:
    phases: List[SimulatedPhase]
    not_simulated: List[Tuple[str, str]] = field(default_factory=list)  # (phase, why)
    seconds: float = 0.0
    verdict: Optional["Verdict"] = None  # set by simulation_report


@dataclass(frozen=True)
class Verdict:
    """The simulation's own answer to "does the launch fit": its peak phase with what it tracked there plus the
    plan's bytes for what it does not run (VAE, reward, text encoders, the runtime overhead), against the budget."""
    phase: str
    tracked: float  # bytes the tracker saw in that phase (0 for a phase not executed)
    outside: float  # the plan's bytes for that phase's components outside the simulation
    budget: float

    @property
    def peak(self) -> float:
        return self.tracked + self.outside

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget


def simulated_verdict(plan, simulation: Simulation) -> Verdict:
    """The largest phase by :class:`Verdict`'s count; phases the simulation does not execute count at the plan's
    figure, so a launch over budget only in (say) the VAE decode is reported over budget here too."""
    budget = plan.gpu_memory_gib * GIB
    candidates = []
    for phase in simulation.phases:
        planned = plan.phase(phase.name)
        outside = sum(c.bytes for c in planned.components if _group_of(c.name) is None) if planned else 0.0
        candidates.append(Verdict(phase.name, phase.total, outside, budget))
    for name, _ in simulation.not_simulated:
        planned = plan.phase(name)
        if planned is not None:
            candidates.append(Verdict(name, 0.0, planned.bytes, budget))
    return max(candidates, key=lambda v: v.peak)


# ====================================================================== building

@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """This process as ``rank`` of a ``fake`` process group of ``world_size`` (collectives return at once)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("the simulation needs its own (fake) process group; one is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def public_config(config: Dict) -> Dict:
    """``config`` without diffusers' bookkeeping keys: ``_use_default_values`` would restore the defaults of the keys
    it names (``num_layers`` among them) over the values given."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _transformer_on_meta(config: Dict, dtype: torch.dtype, cfg: TrainConfig):
    from diffusers import HunyuanVideo15Transformer3DModel

    from sage_grpo.models.attention import install_joint_attention

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel.from_config(public_config(config)).to(dtype)
    # and the sync-free forward (models/transformer_forward.py), splitting rows as on CUDA
    install_joint_attention(model, cfg.model.attention_backend, split_rows_on_cuda(cfg))
    return model


def split_rows_on_cuda(cfg: TrainConfig) -> bool:
    """``--mixed_length_attention`` as a CUDA run decides it (the simulated launch's device)."""
    from sage_grpo.models.attention import split_rows_of

    return split_rows_of(cfg.throughput.mixed_length_attention, torch.device("cuda"))


class _Models(torch.nn.Module):
    """The policy, the reference and the drift proxy's base copy under one root, so that one tracker sees them."""

    def __init__(self, policy, reference, base):
        super().__init__()
        self.policy = policy
        self.reference = reference
        self.base = base


def build_sharded(cfg: TrainConfig, world_size: int, config: Dict, placement):
    """(policy, reference, dims, lora, base) parallelized as ``parallelize_models`` does, still on ``meta``: the
    reference is None without one, ``base`` (the drift proxy's frozen copy) where the run holds none; with
    ``--use_lora`` the reference is None too and ``lora`` the trainer's
    :class:`~sage_grpo.models.lora.LoraTraining` on the policy (the frozen base in ``--dtype``, the adapters in
    ``--master_weight_type``, the KL anchor a second adapter), built by the trainer's own
    :func:`~sage_grpo.models.bundle.build_lora`."""
    from sage_grpo.distributed.fsdp import apply_fsdp
    from sage_grpo.distributed.parallel_dims import ParallelDims
    from sage_grpo.distributed.parallelize import policy_param_dtype, shard_frozen
    from sage_grpo.distributed.sequence_parallel import apply_sequence_parallel
    from sage_grpo.dtypes import DTYPES
    from sage_grpo.models.bundle import build_lora
    from sage_grpo.rl import drift_watch_of, kl_mode_of

    from sage_grpo.config import ConfigError

    if not (cfg.parallel.enable_fsdp and world_size > 1):
        raise ConfigError("--simulate covers FSDP2 launches on several ranks (torch's FSDP memory tracker), full "
                          "fine-tuning or --use_lora; this launch is planned only: pass --enable_fsdp and "
                          "--world_size > 1")
    dims = ParallelDims(world_size=world_size, sp_size=cfg.parallel.sp_size, dp_replicate=cfg.parallel.dp_replicate,
                        batch_size=cfg.data.batch_size, num_generations=cfg.data.num_generations,
                        num_attention_heads=config.get("num_attention_heads", 16))
    dims.build_meshes()
    kl_mode = kl_mode_of(cfg.trust_region)
    lora = reference = base = None
    if cfg.lora.use_lora:  # as build_models: the base loaded in --dtype, frozen, the adapters in the master dtype
        policy = _transformer_on_meta(config, DTYPES[cfg.model.dtype], cfg)
        lora = build_lora(cfg, kl_mode, policy, DTYPES[cfg.model.master_weight_type])
    else:
        policy = _transformer_on_meta(config, DTYPES[cfg.model.master_weight_type], cfg)
        policy.requires_grad_(True)
        frozen = [kl_mode.uses_reference, drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl_mode).base_copy]
        reference, base = [_transformer_on_meta(config, DTYPES[cfg.model.dtype], cfg)
                           .requires_grad_(False).eval() if wanted else None for wanted in frozen]
    policy.train()
    for model in (policy, reference, base):
        if model is not None:
            apply_sequence_parallel(model, dims.sp_group)
    apply_fsdp(policy, dims.fsdp_mesh, param_dtype=policy_param_dtype(cfg), reduce_dtype=torch.float32,
               activation_checkpointing=cfg.parallel.enable_gradient_checkpointing)
    for model in (reference, base):  # offloaded shards are left on the device here and out of its tally (docstring)
        if model is not None:
            shard_frozen(model, dims.fsdp_mesh, offload=False)
    return policy, reference, dims, lora, base


# ====================================================================== running the phases

def _embeds(cfg: TrainConfig, batch: int, config: Dict, dtype: torch.dtype):
    """Fake prompt conditioning of ``batch`` prompts: every MLLM and byT5 slot valid (the planner's worst case); with
    the CFG rows split (``--mixed_length_attention``) the negative prompt has :data:`NEGATIVE_VALID_TOKENS` valid
    slots, so the blocks run the split calls (masked calls would run SDPA's math kernel on the CPU, which a GPU's
    masked kernels do not: the simulation keeps equal lengths, and no mask, then)."""
    from sage_grpo.models.text_encoding import PromptEmbeds, TextEncoderSettings

    mllm = cfg.model.text_max_length or TextEncoderSettings.max_length

    def stream(length: int, width: int):
        return (torch.zeros(batch, length, width, dtype=dtype), torch.ones(batch, length, dtype=torch.int64))

    (text, mask), (glyph, glyph_mask) = stream(mllm, config["text_embed_dim"]), stream(cfg.model.byt5_max_length,
                                                                                       config["text_embed_2_dim"])
    negative = NEGATIVE_VALID_TOKENS if cfg.rollout.cfg_scale > 1 and split_rows_on_cuda(cfg) else mllm + cfg.model.byt5_max_length
    counted = ((mllm + cfg.model.byt5_max_length, negative),) * batch  # what the forward reads, on the host
    return PromptEmbeds(text, mask, glyph, glyph_mask, text.clone(), mask.clone(), glyph.clone(), glyph_mask.clone(),
                        valid_tokens=counted)


def _warm_up(policy: torch.nn.Module, optimizer) -> None:
    """One untracked step on zero gradients, so that the optimizer's state exists as from a run's second step on;
    the parameters the model never uses (the last block's text outputs) get no gradient and no state, as in a run."""
    last = policy.transformer_blocks[-1]
    unused = {id(p) for m in (last.attn.to_add_out, last.ff_context) for p in m.parameters()}
    for param in policy.parameters():
        if param.requires_grad and id(param) not in unused:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _reference_of(reference, lora):
    """The KL reference for its phase: the reference model, or the LoRA policy switched by the trainer's own
    ``LoraTraining.reference_mode`` (the anchor adapter once refreshed, else adapters disabled)."""
    return lora.reference_mode() if lora is not None else contextlib.nullcontext(reference)


def simulate(cfg: TrainConfig, world_size: int, placement, config: Dict, video_tokens_shape: Tuple[int, int, int]):
    """Run the transformer phases of one GRPO step on fake tensors; ``video_tokens_shape``: the latent (F, h, w)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sage_grpo.distributed.fsdp import gradient_sync
    from sage_grpo.distributed.parallelize import clip_gradients
    from sage_grpo.dtypes import DTYPES
    from sage_grpo.dtypes import autocast_dtype_of
    from sage_grpo.optim.optimizers import build_optimizer, optimizer_parts
    from sage_grpo.models.velocity import cfg_velocity
    from sage_grpo.rl import kl_mode_of

    started = time.perf_counter()
    result = Simulation([], [
        ("encode", "the text encoders are another model family (Qwen2.5-VL, byT5); their bytes are the plan's"),
        ("decode + reward", "VAE decode and VideoAlign are other model families; their bytes are the plan's"),
        ("checkpoint save", "host memory and disk: sharded state is written by each rank from its own shards")])
    with fake_process_group(world_size), metadata_only_propagation(), forward_only_module_tracking():
        policy, reference, _dims, lora, base = build_sharded(cfg, world_size, config, placement)
        models = _Models(policy, reference, base)
        from torch.distributed.fsdp import fully_shard

        fully_shard(models, mesh=_dims.fsdp_mesh)  # the tracker wants an FSDP root; this one holds no parameters
        frames, height, width = video_tokens_shape
        batch, autocast = cfg.parallel.mini_batch_size_per_update, autocast_dtype_of(cfg)
        with FakeTensorMode(allow_non_fake_inputs=True):
            models.to_empty(device="cpu")
            optimizer = build_optimizer(policy.named_parameters(), use_muon=cfg.optim.use_muon, lr=cfg.optim.learning_rate,
                                        weight_decay=cfg.optim.weight_decay)
            if cfg.optim.use_muon:  # the Newton-Schulz dtype a GPU picks (sage_grpo.optim.muon.newton_schulz_dtype)
                optimizer.optimizers["muon"].ns_dtype = torch.bfloat16
            for part in optimizer_parts(optimizer).values():  # torch's AdamW picks foreach on CUDA, not on the CPU
                if isinstance(part, torch.optim.AdamW):
                    for group in part.param_groups:
                        group["foreach"] = True
            _warm_up(policy, optimizer)
            latents = torch.zeros(batch, config["out_channels"], frames, height, width)
            trajectories = torch.zeros(cfg.data.batch_size, cfg.rollout.grpo_sampling_steps + 1, *latents.shape[1:])
            timesteps = torch.full((batch,), 500.0)
            step_embeds = _embeds(cfg, cfg.data.batch_size, config, DTYPES[cfg.model.dtype])  # the step's, as the trainer's
            inputs = (trajectories, *(getattr(step_embeds, f) for f in ("embeds", "masks", "embeds_2", "masks_2",
                                                                       "neg_embeds", "neg_masks", "neg_embeds_2",
                                                                       "neg_masks_2")))

            def velocity(model, rows: int = batch):  # one call of ``rows`` transitions (CFG doubles them)
                return cfg_velocity(model, latents.new_zeros(rows, *latents.shape[1:]), timesteps.new_full((rows,), 500.0),
                                    step_embeds.select([i % cfg.data.batch_size for i in range(rows)]), cfg.rollout.cfg_scale,
                                    autocast_dtype=autocast, num_image_tokens=cfg.model.vision_num_semantic_tokens,
                                    timesteps_r=timesteps.new_full((rows,), 400.0))  # used by mean-flow models

            with Phase("rollout", models, optimizer, inputs, "policy, no grad, CFG batch") as phase, torch.no_grad():
                velocity(policy)
            result.phases.append(phase.result)
            if kl_mode_of(cfg.trust_region).uses_reference:  # the reference means, held on the device until the step ends
                inputs += (torch.zeros(cfg.data.batch_size, cfg.rollout.grpo_sampling_steps, *latents.shape[1:]),)
            if reference is not None or (lora is not None and kl_mode_of(cfg.trust_region).uses_reference):
                rows = placement.reference_batch_size or batch  # the planner's choice (--reference_batch_size)
                if lora is not None and lora.has_anchor:  # the anchor adapter, as from the first refresh on
                    lora.refresh_anchor()
                with Phase("reference", models, optimizer, inputs, f"KL means, no grad, {rows} transitions per call"
                           + (", the LoRA policy as its reference" if lora is not None else "")) as phase, \
                        torch.no_grad(), _reference_of(reference, lora) as model:
                    velocity(model, rows)
                result.phases.append(phase.result)
            # An update's window has several backwards; the peak is in a later one, with the earlier ones' gradients
            # held: sharded (per_backward) or unsharded fp32 until the window's last backward reduces them (per_update)
            passes = [True, True] if placement.reduce_per_backward else [False, True]
            group = placement.replay_group_size  # a sample's trained steps per forward (--replay_group_size)
            with Phase("train", models, optimizer, inputs, f"forward + backward of {group} (sample, step) pair(s) per "
                       "sample, twice: " + ("both reduced" if placement.reduce_per_backward else "held, then reduced")
                       ) as phase:
                for reduce_now in passes:
                    with gradient_sync(policy, enabled=reduce_now):
                        velocity(policy, batch * group).square().mean().backward()
                    phase.tracker.reset_mod_stats()  # per-module stats cover one pass; the peak is kept
            result.phases.append(phase.result)
            params = [p for p in policy.parameters() if p.grad is not None]
            with Phase("optimizer step", models, optimizer, inputs, "global-norm clip, "
                       + ("Muon + AdamW" if cfg.optim.use_muon else "AdamW") + " step, zero_grad") as phase:
                clip_gradients(params, cfg.optim.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            result.phases.append(phase.result)
            if reference is not None or (lora is not None and lora.has_anchor):
                with Phase("anchor refresh", models, optimizer, inputs, "LoRA: the policy adapter copied into the "
                           "anchor" if lora is not None else "reference.load_state_dict(policy's)") as phase, \
                        torch.no_grad():
                    if lora is not None:
                        lora.refresh_anchor()
                    else:
                        reference.load_state_dict(policy.state_dict(), strict=True)
                result.phases.append(phase.result)
        if placement.reference_on_cpu:
            result.phases = [without(without(p, reference, "Sharded Param"), base, "Sharded Param", "frozen base")
                             for p in result.phases]
    result.seconds = time.perf_counter() - started
    return result


# ====================================================================== against the plan

# Planner components by the group of tracker categories they stand for (matched on the start of their names); the
# rest (VAE, reward, text encoders, runtime overhead, their activations) are not in the simulation.
_PLANNER_GROUPS = (
    ("sharded weights", ("policy weights", "reference (KL anchor) shards", "frozen base (drift proxy) shards")),
    ("gathered weights", ("FSDP gathered units", "reference gathered units", "reference from the CPU")),
    ("gradients", ("gradients", "FSDP unsharded block gradient")),
    ("optimizer state", ("optimizer:",)),
    ("activations", ("activations", "rollout block activations", "reference block activations",
                     "autocast bf16 weight copies", "optimizer step temporaries")),
    ("inputs", ("rollout latents", "prompt embeddings", "reference means")),
)


def _group_of(component: str) -> Optional[str]:
    return next((g for g, prefixes in _PLANNER_GROUPS if component.startswith(prefixes)), None)


def planner_groups(phase) -> Tuple[Dict[str, float], List[str]]:
    """(bytes per group, names of the components outside the simulation) of a planner phase."""
    groups = {name: 0.0 for name in GROUPS}
    outside = []
    for component in phase.components:
        group = _group_of(component.name)
        if group is None:
            if component.bytes:
                outside.append(f"{component.name} {component.bytes / GIB:.2f}")
        else:
            groups[group] += component.bytes
    return groups, outside


def _ratio(simulated: float, planned: float) -> str:
    if planned == 0:
        return "—" if simulated < 0.005 * GIB else "∞"
    return f"{simulated / planned:.3f}"


def comparison_table(plan, simulation: Simulation) -> str:
    """Per simulated phase and group: the tracker's bytes at the phase's peak, the plan's, their ratio; FLOPs."""
    lines = ["| phase | group | simulated GB | planned GB | ratio |", "|---|---|---:|---:|---:|"]
    for phase in simulation.phases:
        planned = plan.phase(phase.name)
        groups, _ = planner_groups(planned) if planned is not None else ({}, [])
        for group in GROUPS:
            simulated, expected = phase.group(group), groups.get(group, 0.0)
            if simulated or expected:
                lines.append(f"| {phase.name} | {group} | {simulated / GIB:.3f} | "
                             f"{expected / GIB if planned is not None else float('nan'):.3f} | "
                             f"{_ratio(simulated, expected) if planned is not None else 'no plan phase'} |")
    lines += ["", "| phase | simulated GB (tracked groups) | FLOPs on this rank | seconds | note |",
              "|---|---:|---:|---:|---|"]
    lines += [f"| {p.name} | {p.total / GIB:.2f} | {p.flops:.4g} | {p.seconds:.1f} | {p.note} |"
              for p in simulation.phases]
    peak = max(simulation.phases, key=lambda p: p.total)
    lines += ["", f"simulated peak (tracked groups): {peak.total / GIB:.2f} GB in the {peak.name} phase; "
              f"simulation took {simulation.seconds:.0f} s"]
    for name, why in simulation.not_simulated:
        planned = plan.phase(name)
        lines.append(f"not simulated: {name} ({why})" + (f"; planned {planned.bytes / GIB:.2f} GB" if planned else ""))
    if plan.phases:
        _, outside = planner_groups(plan.peak)
        lines.append("planned but outside the simulation in the peak phase: " + ", ".join(outside))
    verdict = simulated_verdict(plan, simulation)
    plan_says = "fits" if plan.fits() else "does not fit"
    lines.append(f"simulated verdict: {verdict.peak / GIB:.2f} GB in the {verdict.phase} phase ({verdict.tracked / GIB:.2f} "
                 f"tracked + {verdict.outside / GIB:.2f} planned outside the simulation) of {plan.gpu_memory_gib:g} GB: "
                 + ("fits" if verdict.fits else "OVER BUDGET") + f"; the plan: {plan.peak_gib:.2f} GB, {plan_says}"
                 + ("" if verdict.fits == plan.fits() else " (the two disagree: the launch is within the plan's "
                                                             "tolerance of the budget; test it before renting)"))
    from sage_grpo.plan.memory import MARGIN, RUNTIME_OVERHEAD_GIB

    lines.append("unseen by the simulation: " + "; ".join(UNSEEN) + f" (the plan's {RUNTIME_OVERHEAD_GIB:g} GB runtime "
                 f"overhead and the {MARGIN:.0%} its auto decisions keep free stand for them)")
    return "\n".join(lines)


def latent_shape(cfg: TrainConfig, sizes) -> Tuple[int, int, int]:
    """(F, h, w) of the rollout latents (the VAE's compression of the rollout video)."""
    from sage_grpo.config.validation import rollout_size

    vae = sizes.vae_config
    height, width = rollout_size(cfg)
    return ((cfg.rollout.sample_n_frames - 1) // vae["temporal_compression_ratio"] + 1,
            height // vae["spatial_compression_ratio"], width // vae["spatial_compression_ratio"])


def simulation_report(cfg: TrainConfig, world_size: int, gpu_memory_gib: float, num_layers: Optional[int] = None) \
        -> Tuple[str, Simulation]:
    """The text ``--simulate`` prints (the plan's placements, then :func:`comparison_table`) and the simulation."""
    import dataclasses

    from sage_grpo.plan.memory import plan_launch, sizes_of
    from sage_grpo.plan.sizes import transformer_sizes

    sizes = sizes_of(cfg)
    config = public_config(sizes.transformer.config)
    if num_layers is not None:  # a reduced depth: the plan is of that depth too
        config["num_layers"] = num_layers
        sizes = dataclasses.replace(sizes, transformer=transformer_sizes(config))
    plan = plan_launch(cfg, world_size, gpu_memory_gib, sizes)
    simulation = simulate(cfg, world_size, plan.placement, config, latent_shape(cfg, sizes))
    head = (f"simulated GRPO step: {world_size} ranks (fake process group, rank 0), sp {cfg.parallel.sp_size}, "
            f"{config['num_layers']} blocks, fake tensors on the CPU; placement {plan.placement}; CFG rows "
            + (f"split (the negative prompt's {NEGATIVE_VALID_TOKENS} valid text slots attend apart)"
               if cfg.rollout.cfg_scale > 1 and split_rows_on_cuda(cfg) else "of equal length (every text slot valid)"))
    simulation.verdict = simulated_verdict(plan, simulation)
    return head + "\n\n" + comparison_table(plan, simulation), simulation

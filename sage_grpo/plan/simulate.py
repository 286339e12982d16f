"""A GRPO step executed without a GPU: the real transformer classes at the launch's size, the project's own Ulysses,
FSDP2, checkpointing and autocast, run on fake tensors over a fake process group, with torch's FSDP memory tracker
and FLOP counter watching each phase (``python -m sage_grpo.plan <flags> --simulate``).

How: one process joins a ``fake`` process group of ``--world_size`` ranks as rank 0 (:mod:`sage_grpo.plan.fake_launch`)
and builds the meshes of
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
families: their memory is the planner's estimate), checkpoint save (host memory and disk, not the GPU). The tracker's
bytes are set beside the plan's in :mod:`sage_grpo.plan.comparison`.
"""

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch.distributed.fsdp import fully_shard

from sage_grpo import rl
from sage_grpo.config.train import OptimConfig
from sage_grpo.config.validation import rollout_size
from sage_grpo.distributed.fsdp import gradient_sync
from sage_grpo.distributed.parallelize import clip_gradients
from sage_grpo.dtypes import DTYPES, autocast_dtype_of
from sage_grpo.models.velocity import cfg_velocity
from sage_grpo.optim.optimizers import build_optimizer, optimizer_parts
from sage_grpo.plan.breakdown import GIB  # noqa: F401 (API)
from sage_grpo.plan.comparison import (Simulation, comparison_table, planner_groups,  # noqa: F401 (API)
                                       simulated_verdict)
from sage_grpo.plan.fake_launch import (NEGATIVE_VALID_TOKENS, build_sharded, fake_embeds, fake_process_group,
                                        public_config, split_rows_on_cuda)
from sage_grpo.plan.memory import plan_launch, sizes_of
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.sizes import TextTokens, transformer_sizes
from sage_grpo.plan.tracking import (Phase, SimulatedPhase, forward_only_module_tracking, metadata_only_propagation,
                                     without)

NOT_SIMULATED = (
    ("encode", "the text encoders are another model family (Qwen2.5-VL, byT5); their bytes are the plan's"),
    ("decode + reward", "VAE decode and VideoAlign are other model families; their bytes are the plan's"),
    ("checkpoint save", "host memory and disk: sharded state is written by each rank from its own shards"))


@dataclass(frozen=True)
class FakeStep:
    """What the simulated step runs, read from the run's sections."""

    rows: int  # --mini_batch_size_per_update: transitions per policy call
    batch: int  # --batch_size: the rollout batch, its trajectories and prompts
    steps: int  # --grpo_sampling_steps
    cfg_scale: float
    autocast: Optional[torch.dtype]  # the forward's autocast dtype
    dtype: torch.dtype  # --dtype: the prompt embeddings'
    text: TextTokens
    split_negative: bool  # the CFG rows attend apart (--mixed_length_attention as CUDA decides it)
    uses_reference: bool  # the KL mode holds reference means
    latent: Tuple[int, int, int]  # (F, h, w) of a rollout latent

    @classmethod
    def of(cls, cfg: PlanOptions, latent: Tuple[int, int, int]) -> "FakeStep":
        return cls(cfg.parallel.mini_batch_size_per_update, cfg.data.batch_size, cfg.rollout.grpo_sampling_steps,
                   cfg.rollout.cfg_scale, autocast_dtype_of(cfg), DTYPES[cfg.model.dtype], TextTokens.of(cfg.model),
                   cfg.rollout.cfg_scale > 1 and split_rows_on_cuda(cfg.throughput),
                   rl.kl_mode_of(cfg.trust_region).uses_reference, latent)


class _Models(torch.nn.Module):
    """The policy, the reference and the drift proxy's base copy under one root, so that one tracker sees them."""

    def __init__(self, policy, reference, base):
        super().__init__()
        self.policy = policy
        self.reference = reference
        self.base = base


@dataclass
class _Run:
    """The simulated step's models, optimizer and inputs (the step's tensors the tracker books as inputs), and its
    one transformer call."""

    models: _Models
    lora: object  # the trainer's LoraTraining, or None
    optimizer: object
    step: FakeStep
    config: Dict  # the transformer's
    inputs: Tuple[torch.Tensor, ...] = ()

    def __post_init__(self):
        step = self.step
        self.latents = torch.zeros(step.rows, self.config["out_channels"], *step.latent)
        trajectories = torch.zeros(step.batch, step.steps + 1, *self.latents.shape[1:])
        self.timesteps = torch.full((step.rows,), 500.0)
        self.embeds = fake_embeds(step.text, step.split_negative, step.batch, self.config, step.dtype)  # the step's
        self.inputs = (trajectories, *(getattr(self.embeds, f) for f in (
            "embeds", "masks", "embeds_2", "masks_2", "neg_embeds", "neg_masks", "neg_embeds_2", "neg_masks_2")))

    def velocity(self, model, rows: Optional[int] = None):
        """One call of ``rows`` transitions (default ``--mini_batch_size_per_update``; CFG doubles them)."""
        rows, step = rows or self.step.rows, self.step
        return cfg_velocity(model, self.latents.new_zeros(rows, *self.latents.shape[1:]),
                            self.timesteps.new_full((rows,), 500.0),
                            self.embeds.select([i % step.batch for i in range(rows)]), step.cfg_scale,
                            autocast_dtype=step.autocast, num_image_tokens=step.text.image,
                            timesteps_r=self.timesteps.new_full((rows,), 400.0))  # used by mean-flow models

    def phase(self, name: str, note: str) -> Phase:
        return Phase(name, self.models, self.optimizer, self.inputs, note)


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


def _optimizer(policy: torch.nn.Module, optim: OptimConfig):
    """The trainer's optimizer as a GPU runs it: Newton-Schulz in bf16, torch's AdamW in its foreach implementation."""
    optimizer = build_optimizer(policy.named_parameters(), use_muon=optim.use_muon, lr=optim.learning_rate,
                                weight_decay=optim.weight_decay)
    if optim.use_muon:  # the Newton-Schulz dtype a GPU picks (sage_grpo.optim.muon.newton_schulz_dtype)
        optimizer.optimizers["muon"].ns_dtype = torch.bfloat16
    for part in optimizer_parts(optimizer).values():  # torch's AdamW picks foreach on CUDA, not on the CPU
        if isinstance(part, torch.optim.AdamW):
            for group in part.param_groups:
                group["foreach"] = True
    return optimizer


def _reference_of(reference, lora):
    """The KL reference for its phase: the reference model, or the LoRA policy switched by the trainer's own
    ``LoraTraining.reference_mode`` (the anchor adapter once refreshed, else adapters disabled)."""
    return lora.reference_mode() if lora is not None else contextlib.nullcontext(reference)


def simulate(built, placement, step: FakeStep, optim: OptimConfig, config: Dict) -> Simulation:
    """Run the transformer phases of one GRPO step on fake tensors, on the models :func:`build_sharded` ``built``
    (inside the fake process group); ``config``: the transformer's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    policy, reference, dims, lora, base = built
    models = _Models(policy, reference, base)
    fully_shard(models, mesh=dims.fsdp_mesh)  # the tracker wants an FSDP root; this one holds no parameters
    result = Simulation([], list(NOT_SIMULATED))
    with FakeTensorMode(allow_non_fake_inputs=True):
        models.to_empty(device="cpu")
        optimizer = _optimizer(policy, optim)
        _warm_up(policy, optimizer)
        run = _Run(models, lora, optimizer, step, config)
        result.phases.append(_rollout(run))
        if step.uses_reference:  # the reference means, held on the device until the step ends
            run.inputs += (torch.zeros(step.batch, step.steps, *run.latents.shape[1:]),)
        if reference is not None or (lora is not None and step.uses_reference):
            result.phases.append(_reference(run, placement))
        result.phases.append(_train(run, placement))
        result.phases.append(_optimizer_step(run, optim))
        if reference is not None or (lora is not None and lora.has_anchor):
            result.phases.append(_anchor_refresh(run))
    if placement.reference_on_cpu:
        result.phases = [without(without(p, reference, "Sharded Param"), base, "Sharded Param", "frozen base")
                         for p in result.phases]
    return result


def _rollout(run: _Run) -> SimulatedPhase:
    with run.phase("rollout", "policy, no grad, CFG batch") as phase, torch.no_grad():
        run.velocity(run.models.policy)
    return phase.result


def _reference(run: _Run, placement) -> SimulatedPhase:
    rows = placement.reference_batch_size or run.step.rows  # the planner's choice (--reference_batch_size)
    lora = run.lora
    if lora is not None and lora.has_anchor:  # the anchor adapter, as from the first refresh on
        lora.refresh_anchor()
    with run.phase("reference", f"KL means, no grad, {rows} transitions per call"
                   + (", the LoRA policy as its reference" if lora is not None else "")) as phase, \
            torch.no_grad(), _reference_of(run.models.reference, lora) as model:
        run.velocity(model, rows)
    return phase.result


def _train(run: _Run, placement) -> SimulatedPhase:
    """An update's window has several backwards; the peak is in a later one, with the earlier ones' gradients held:
    sharded (per_backward) or unsharded fp32 until the window's last backward reduces them (per_update)."""
    passes = [True, True] if placement.reduce_per_backward else [False, True]
    group = placement.replay_group_size  # a sample's trained steps per forward (--replay_group_size)
    policy = run.models.policy
    with run.phase("train", f"forward + backward of {group} (sample, step) pair(s) per sample, twice: "
                   + ("both reduced" if placement.reduce_per_backward else "held, then reduced")) as phase:
        for reduce_now in passes:
            with gradient_sync(policy, enabled=reduce_now):
                run.velocity(policy, run.step.rows * group).square().mean().backward()
            phase.tracker.reset_mod_stats()  # per-module stats cover one pass; the peak is kept
    return phase.result


def _optimizer_step(run: _Run, optim: OptimConfig) -> SimulatedPhase:
    params = [p for p in run.models.policy.parameters() if p.grad is not None]
    with run.phase("optimizer step", "global-norm clip, " + ("Muon + AdamW" if optim.use_muon else "AdamW")
                   + " step, zero_grad") as phase:
        clip_gradients(params, optim.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    return phase.result


def _anchor_refresh(run: _Run) -> SimulatedPhase:
    lora, models = run.lora, run.models
    with run.phase("anchor refresh", "LoRA: the policy adapter copied into the anchor" if lora is not None
                   else "reference.load_state_dict(policy's)") as phase, torch.no_grad():
        if lora is not None:
            lora.refresh_anchor()
        else:
            models.reference.load_state_dict(models.policy.state_dict(), strict=True)
    return phase.result


def latent_shape(frames: int, height: int, width: int, vae_config: Dict) -> Tuple[int, int, int]:
    """(F, h, w) of the latents of a ``frames x height x width`` video (the VAE's compression)."""
    return ((frames - 1) // vae_config["temporal_compression_ratio"] + 1,
            height // vae_config["spatial_compression_ratio"], width // vae_config["spatial_compression_ratio"])


def simulation_report(cfg: PlanOptions, world_size: int, gpu_memory_gib: float, num_layers: Optional[int] = None) \
        -> Tuple[str, Simulation]:
    """The text ``--simulate`` prints (the plan's placements, then :func:`comparison_table`) and the simulation."""
    sizes = sizes_of(cfg)
    config = public_config(sizes.transformer.config)
    if num_layers is not None:  # a reduced depth: the plan is of that depth too
        config["num_layers"] = num_layers
        sizes = dataclasses.replace(sizes, transformer=transformer_sizes(config))
    plan = plan_launch(cfg, world_size, gpu_memory_gib, sizes)
    step = FakeStep.of(cfg, latent_shape(cfg.rollout.sample_n_frames, *rollout_size(cfg), sizes.vae_config))
    started = time.perf_counter()
    with fake_process_group(world_size), metadata_only_propagation(), forward_only_module_tracking():
        built = build_sharded(cfg, world_size, config, plan.placement)
        simulation = simulate(built, plan.placement, step, cfg.optim, config)
    simulation.seconds = time.perf_counter() - started
    head = (f"simulated GRPO step: {world_size} ranks (fake process group, rank 0), sp {cfg.parallel.sp_size}, "
            f"{config['num_layers']} blocks, fake tensors on the CPU; placement {plan.placement}; CFG rows "
            + (f"split (the negative prompt's {NEGATIVE_VALID_TOKENS} valid text slots attend apart)"
               if step.split_negative else "of equal length (every text slot valid)"))
    simulation.verdict = simulated_verdict(plan, simulation)
    return head + "\n\n" + comparison_table(plan, simulation), simulation

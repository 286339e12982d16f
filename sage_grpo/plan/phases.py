"""The phases of a GRPO step and the components each holds at its peak, per GPU: the plan of one placement.

**Phases**: encode (text encoders, when offloaded), rollout (policy, no grad), reference (KL means, no grad), train
(forward + backward), optimizer step (:func:`~sage_grpo.plan.components.optimizer_step`), decode + reward, validation
(sampling, decode, scoring, the drift proxy's base forwards). The peak is the largest phase. Every transformer phase
is checked category by category against torch's memory tracker on fake tensors (``--simulate``,
:mod:`sage_grpo.plan.simulate`). The components' formulas are :mod:`sage_grpo.plan.components`'.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

from sage_grpo.config.validation import rollout_size, validation_size
from sage_grpo.models.placement import Placement
from sage_grpo.plan import components as parts
from sage_grpo.plan.breakdown import Component, MemoryPlan, Phase
from sage_grpo.plan.components import Layout, layout_of
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.scorers import reward_forward_row, validation_scoring_row
from sage_grpo.plan.sizes import ModelSizes, training_activation_elements, video_token_count

Video = Tuple[int, int, int]  # frames, height, width


@dataclass(frozen=True)
class Step:
    """What one step runs, read from the run's sections: its rollout batch, its videos and its training forward."""

    batch: int  # B, --batch_size
    steps: int  # N, --grpo_sampling_steps
    sde_steps: int  # N_sde: --sde_window_size, or N
    video: Video  # a rollout video
    validation_video: Optional[Video]  # a validation video; None without validation
    checkpointing: bool  # --enable_gradient_checkpointing

    @classmethod
    def of(cls, cfg: PlanOptions) -> "Step":
        validating = cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0
        return cls(cfg.data.batch_size, cfg.rollout.grpo_sampling_steps,
                   cfg.rollout.sde_window_size or cfg.rollout.grpo_sampling_steps,
                   (cfg.rollout.sample_n_frames, *rollout_size(cfg)),
                   (cfg.validation.validate_video_length, *validation_size(cfg)) if validating else None,
                   cfg.parallel.enable_gradient_checkpointing)


def plan_memory(cfg: PlanOptions, sizes: ModelSizes, world_size: int, gpu_memory_gib: float,
                placement: Placement, device_type: str = "cuda") -> MemoryPlan:
    """The per-GPU plan of ``cfg`` on ``world_size`` GPUs for a fixed ``placement``."""
    return step_plan(layout_of(cfg, sizes, world_size, device_type), Step.of(cfg), placement, gpu_memory_gib)


def step_plan(lay: Layout, step: Step, placement: Placement, gpu_memory_gib: float) -> MemoryPlan:
    """The phases of ``step`` in the layout ``lay`` with ``placement``."""
    tokens = video_token_count(lay.sizes, *step.video)
    resident = parts.resident(lay, placement)
    latents = step.batch * (step.steps + 1) * _latent_elements(lay, tokens) * 4
    inputs = [Component("rollout latents x_0..x_N", latents, "B·(N+1)·latent·4"),
              parts.prompt_embeddings(lay, step.batch)]
    means = [Component("reference means", latents // (step.steps + 1) * step.steps,
                       "B·N·latent·4: reference pass to optimizer step")] if lay.kl.uses_reference else []
    phases = [] if not lay.offload_encoders else [Phase("encode", tuple(resident + [
        parts.encoder_weights(lay, "on the GPU only while encoding"), parts.encode(lay, step.batch)]))]
    phases.append(_rollout(lay, step, resident, inputs, latents, tokens))
    # LoRA: the reference passes run the policy itself, its units gathered as for the rollout
    if lay.separate_reference or (lay.lora.use_lora and lay.kl.uses_reference):
        phases.append(_reference(lay, placement, resident, inputs + means, tokens))
    phases.append(_train(lay, step, placement, resident, inputs + means, tokens))
    phases.append(Phase("optimizer step", tuple(resident + inputs + means + parts.optimizer_step(lay, placement))))
    phases.append(Phase("decode + reward", tuple(resident + inputs + [
        parts.vae_decode(lay, placement, *step.video, "VAE decode"),
        Component(*reward_forward_row(lay.scorers, lay.sizes))])))
    if step.validation_video is not None:
        phases += _validation(lay, placement, resident, step.validation_video)
    return MemoryPlan(tuple(phases), placement, gpu_memory_gib)


def _latent_elements(lay: Layout, tokens: int) -> int:
    """The elements of one video's latent: channels x L tokens x the transformer's patch."""
    config = lay.sizes.transformer.config
    return lay.sizes.vae_config["latent_channels"] * (tokens * config["patch_size"] ** 2 * config["patch_size_t"])


def _rollout(lay: Layout, step: Step, resident: List[Component], inputs: List[Component], latents: int,
             tokens: int) -> Phase:
    # the rollout's SDE noise, moved to the device in one copy (pipeline/rollout.py): one latent per stochastic step
    noise = Component("rollout SDE noise", latents // (step.steps + 1) * step.sde_steps,
                      "B·N_sde·latent·4, N_sde = --sde_window_size or N")
    return Phase("rollout", tuple(resident + parts.gathered_units(lay, lay.gathered, with_gradient=False)
                                  + parts.autocast_copies(lay) + inputs + [noise]
                                  + [parts.no_grad_forward(lay, "rollout block activations", tokens)]))


def _reference(lay: Layout, placement: Placement, resident: List[Component], held: List[Component],
               tokens: int) -> Phase:
    """The KL reference's means: its own model's units, or (LoRA) the policy's, beside the step's ``held`` inputs,
    and the reward's forward when it is scored in the background (``--async_reward``)."""
    units = ([parts.frozen_units(lay, placement, "reference")] if lay.separate_reference
             else parts.gathered_units(lay, lay.gathered, with_gradient=False))
    reward = []
    if placement.async_reward:
        name, nbytes, formula = reward_forward_row(lay.scorers, lay.sizes)
        reward = [Component(f"{name} beside it (--async_reward)", nbytes, formula)]
    forward = parts.no_grad_forward(lay, "reference block activations", tokens, placement.reference_batch_size,
                                    lay.lora.use_lora and lay.kl.moving_anchor)
    return Phase("reference", tuple(resident + units + held + reward + [forward]))


def _train(lay: Layout, step: Step, placement: Placement, resident: List[Component], held: List[Component],
           tokens: int) -> Phase:
    """Forward and backward of the replay group's rows: the policy's units (the last block's gradient at the peak
    when gradients are reduced per backward), the gradients unless an accumulation window keeps them resident, the
    step's ``held`` inputs and the activations at the start of the backward."""
    b = parts.calls(lay, placement.replay_group_size)
    kept, saved = training_activation_elements(lay.sizes.transformer, tokens, lay.text, lay.frozen_outside, lay.sp,
                                                step.checkpointing)
    train = (resident + parts.gathered_units(lay, lay.gathered, with_gradient=placement.reduce_per_backward)
             + parts.autocast_copies(lay))
    if not lay.gradients_persist:
        train.append(parts.gradients(lay, placement))
    formula = ("b·((blocks·(n+T) + L − n + L_img)·D·c + (one block + outside)·a), " if step.checkpointing
               else "b·(blocks·block + outside)·a, ")
    formula += f"b = {b}, n = {tokens // lay.sp}, T = {lay.text.total}, a = {lay.activation:g} B"
    activations = Component("activations" + (" (checkpointed)" if step.checkpointing else ""),
                            b * (kept * lay.compute + saved * lay.activation), formula)
    return Phase("train", tuple(train + held + [activations]))


def _validation(lay: Layout, placement: Placement, resident: List[Component], video: Video) -> List[Phase]:
    """Sampling, decoding and scoring a validation video, and the drift proxy's base forwards (LoRA's and a fixed
    anchor's base: no model of its own)."""
    tokens = video_token_count(lay.sizes, *video)
    phases = [
        Phase("validation sampling", tuple(resident + parts.gathered_units(lay, lay.gathered, with_gradient=False)
                                           + parts.autocast_copies(lay)
                                           + [parts.no_grad_forward(lay, "validation block activations", tokens)])),
        Phase("validation decode", tuple(resident + [parts.vae_decode(lay, placement, *video,
                                                                      "validation VAE decode")])),
        Phase("validation scoring", tuple(resident + [Component(*validation_scoring_row(lay.scorers, lay.sizes,
                                                                                        lay.compute))]))]
    if lay.base_copy:
        phases.append(Phase("drift proxy", tuple(resident + [parts.frozen_units(lay, placement, "frozen base"),
                                                             parts.no_grad_forward(lay, "drift proxy activations",
                                                                                   tokens)])))
    return phases

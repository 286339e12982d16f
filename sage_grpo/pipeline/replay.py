"""Re-score a stored rollout transition x_k -> x_{k+1} under a transformer, with gradients.

This is the one function the trainer uses for the policy log-prob, the reference model's SDE mean and the KL terms
(docs/reference.md#reference-means, docs/reference.md#the-policy-loss): it recomputes the CFG velocity with the same
:func:`~sage_grpo.pipeline.velocity.cfg_velocity` as the rollout (gradients through both branches, one call on
``[negative; positive]``), then evaluates the same SDE kernel with ``prev_sample`` = the stored x_{k+1}. The result
carries μ_θ (differentiable), the log-prob of the stored transition (differentiable through μ) and the kernel's stds.

Given the same transformer weights, micro-batch and settings as the rollout, ``log_prob`` equals the rollout's
``log_probs[:, k]`` exactly (tested with ``torch.equal`` in fp32 for every SDE type). Deterministic (Euler) rollout
steps replay the same way: their log-prob is also taken w.r.t. the SDE mean.
"""

from typing import Union

from torch import Tensor

from sage_grpo import sde
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.velocity import cfg_velocity, next_step_timesteps, step_timesteps


def replay_step(sampler, transformer, latents: Tensor, next_latents: Tensor, index: Union[int, Tensor],
                embeds: PromptEmbeds) -> sde.SDEStepOutput:
    """SDE step output for stored latents (B, C, T, h, w) -> next_latents at step ``index`` (int or (B,) LongTensor).

    ``embeds`` holds the B samples' prompt embeddings (positive and negative); ``sampler`` is the rollout's
    ``Sampler`` (its kernel, η, (N+1,) schedule, guidance scale, autocast dtype and image tokens; it forwards here,
    so this module does not import it). Runs with whatever grad mode the caller is in.
    """
    if latents.shape != next_latents.shape:
        raise ValueError(f"latents {tuple(latents.shape)} and next_latents {tuple(next_latents.shape)} differ")
    if len(embeds) != latents.shape[0]:
        raise ValueError(f"got {len(embeds)} prompt embeddings for a batch of {latents.shape[0]}")
    if isinstance(index, Tensor):
        index = index.to(latents.device)
    timesteps = step_timesteps(sampler.sigmas, index, latents.shape[0])
    velocity = cfg_velocity(transformer, latents, timesteps, embeds, sampler.guidance_scale,
                            autocast_dtype=sampler.autocast_dtype, num_image_tokens=sampler.num_image_tokens,
                            timesteps_r=next_step_timesteps(sampler.sigmas, index, latents.shape[0]))
    return sde.step(sampler.kernel, velocity, latents.float(), sampler.sigmas, index, sampler.eta,
                    prev_sample=next_latents, sde_solver=sampler.sde_solver)

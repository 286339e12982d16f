"""The drift proxies of :mod:`sage_grpo.rl.drift` on real models: the base transformer's velocity as the callable
the pure functions take, and the path KL along a stored trajectory through the sampler's own replay.

The base model's velocity for the denoising error is its *conditional* velocity (no classifier-free guidance): the
denoiser of the data distribution the base model learnt, and one forward per level instead of two.
"""

from typing import Sequence

import torch
from torch import Tensor

from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.velocity import cfg_velocity
from sage_grpo.rl.drift import VelocityFn, denoising_errors, gaussian_path_kl, proxy_noise
from sage_grpo.sde.schedule import NUM_TRAIN_TIMESTEPS


def conditional_velocity(transformer, embeds: PromptEmbeds, sampler) -> VelocityFn:
    """v(x_σ, σ) of ``transformer`` on ``embeds`` (one row per sample of x), unguided, at timestep 1000·σ, in the
    ``sampler``'s autocast dtype and image tokens."""

    def velocity(latents: Tensor, sigma: float) -> Tensor:
        timesteps = torch.full((latents.shape[0],), NUM_TRAIN_TIMESTEPS * sigma, dtype=torch.float32)
        return cfg_velocity(transformer, latents, timesteps, embeds, 1.0, autocast_dtype=sampler.autocast_dtype,
                            num_image_tokens=sampler.num_image_tokens)

    return velocity


@torch.no_grad()
def base_denoising_errors(base, sampler, latents: Tensor, embeds: PromptEmbeds, seeds: Sequence[int],
                          sigmas: Sequence[float]) -> Tensor:
    """(B, L) denoising errors (:func:`~sage_grpo.rl.drift.denoising_errors`) of final latents (B, C, T, h, w) under
    the ``base`` transformer, ε drawn from each sample's ``seeds`` entry."""
    noise = proxy_noise(seeds, len(sigmas), latents.shape[1:])
    return denoising_errors(conditional_velocity(base, embeds, sampler), latents, sigmas, noise)


@torch.no_grad()
def trajectory_path_kl(policy, base, sampler, trajectory: Tensor, embeds: PromptEmbeds) -> Tensor:
    """(B,) path KL (:func:`~sage_grpo.rl.drift.gaussian_path_kl`) between ``policy`` and ``base`` under the
    ``sampler``'s SDE along stored latents (B, N+1, C, T, h, w) of the sampler's schedule."""
    means, base_means, stds = [], [], []
    for k in range(trajectory.shape[1] - 1):
        x, x_next = trajectory[:, k], trajectory[:, k + 1]
        mine = sampler.replay(policy, x, x_next, k, embeds)
        means.append(mine.mean)
        base_means.append(sampler.replay(base, x, x_next, k, embeds).mean)
        stds.append(mine.noise_std.reshape(-1)[0])
    return gaussian_path_kl(torch.stack(means, 1), torch.stack(base_means, 1), torch.stack(stds))

"""Drift proxies: how far a policy's samples have moved off the pre-trained model's data manifold, measured with what
a real run has (the frozen base model, the samples, the prompts) and no ground truth.

The candidates, as pure functions of tensors and a velocity callable so that tests feed them hand-built
fields and the trainer feeds them the base transformer:

* **Base denoising error** (:func:`denoising_errors`, the proxy the trainer logs): noise a finished sample x0 to
  level σ with a fixed ε, let the frozen base model denoise it once, and measure how much of the sample it does not
  give back,

      x_σ = (1 − σ)·x0 + σ·ε,     x̂0 = x_σ − σ·v_base(x_σ, σ),     e_σ(x0) = mean_elems (x̂0 − x0)²

  (rectified flow, ``sde/base.py``'s convention v = ε − x0). The base model was trained to reconstruct samples of its
  data from their noisy versions; a sample off that manifold (a blurred, oversized, tinted disk) is pulled back toward
  it, so e_σ grows with the distance. It is the classic diffusion reconstruction (out-of-distribution) score, one
  base forward per level and sample, and it needs no sampling by the base model.
* **Path KL to the base policy** (:func:`gaussian_path_kl`): Σ_k E|μ_policy,k − μ_base,k|² / (2 n_k²) along the
  validation trajectories under the training SDE; two forwards per sampling step and sample.
* **Distance to the base model's own samples** on the same prompts and seeds (:func:`paired_rms`, per sample, and
  :func:`energy_distance`, between the two sets): the base samples are drawn once.

``scripts/drift_proxy_study.py`` measures all of them against the toy world's true manifold error
(``docs/toy_study.md``, "Drift proxy"), which is how the denoising error was chosen.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from sage_grpo.rl.inner_epochs import derived_seed

VelocityFn = Callable[[Tensor, float], Tensor]  # (x_σ (B, ...), σ) -> v (B, ...), fp32
NOISE_SALT = 34  # ε of a sample is drawn from derived_seed(seed, NOISE_SALT), never from its own initial noise


def proxy_noise(seeds: Sequence[int], num_levels: int, shape: Sequence[int]) -> Tensor:
    """(L, B, *shape) fp32 standard normal ε of the denoising error, drawn on the CPU from one generator per sample
    seeded from its (validation) seed: the same ε at every validation, no draw from any generator the training uses,
    and not the sample's own initial noise (which seeds the generator of ``seed`` itself)."""
    generators = [torch.Generator("cpu").manual_seed(derived_seed(seed, NOISE_SALT)) for seed in seeds]
    per_sample = [torch.randn((num_levels, *shape), generator=g, dtype=torch.float32) for g in generators]
    return torch.stack(per_sample, dim=1)


@torch.no_grad()
def denoising_errors(velocity: VelocityFn, latents: Tensor, sigmas: Sequence[float], noise: Tensor) -> Tensor:
    """(B, L) e_σ for each sample of ``latents`` (B, ...) and each level of ``sigmas`` (L values in (0, 1)), with
    ``noise`` (L, B, ...) the fixed ε (:func:`proxy_noise`); the mean squared x0 reconstruction error per element."""
    if noise.shape != (len(sigmas), *latents.shape):
        raise ValueError(f"noise {tuple(noise.shape)} does not match {len(sigmas)} levels of latents "
                         f"{tuple(latents.shape)}")
    x0 = latents.float()
    errors = []
    for sigma, eps in zip(sigmas, noise):
        if not 0.0 < sigma < 1.0:
            raise ValueError(f"noise levels must lie in (0, 1), got {sigma}")
        eps = eps.to(x0.device)
        noisy = (1.0 - sigma) * x0 + sigma * eps
        x0_hat = noisy - sigma * velocity(noisy, sigma).float()
        errors.append((x0_hat - x0).pow(2).flatten(1).mean(1))
    return torch.stack(errors, dim=1)


def gaussian_path_kl(means: Tensor, base_means: Tensor, noise_std: Tensor) -> Tensor:
    """(B,) KL between two Gaussian Markov chains with the same per-step noise std, per latent element:
    Σ_k mean_elems (μ_k − μ'_k)² / (2 n_k²), for means (B, N, ...) and ``noise_std`` (N,) > 0."""
    if means.shape != base_means.shape or means.shape[1] != noise_std.numel():
        raise ValueError(f"means {tuple(means.shape)}, base means {tuple(base_means.shape)} and noise std "
                         f"{tuple(noise_std.shape)} disagree")
    squared = (means.float() - base_means.float()).pow(2).flatten(2).mean(2)  # (B, N)
    return (squared / (2.0 * noise_std.float().to(squared.device).pow(2))).sum(1)


def paired_rms(samples: Tensor, base_samples: Tensor) -> Tensor:
    """(B,) RMS difference between each sample and the base model's sample of the same prompt and seed."""
    if samples.shape != base_samples.shape:
        raise ValueError(f"samples {tuple(samples.shape)} and base samples {tuple(base_samples.shape)} differ")
    return (samples.float() - base_samples.float()).pow(2).flatten(1).mean(1).sqrt()


def energy_distance(samples: Tensor, base_samples: Tensor) -> Tensor:
    """() energy distance 2·E|X − Y| − E|X − X'| − E|Y − Y'| between two sets of samples (n, ...) and (m, ...)
    (Euclidean, per-element RMS scale): 0 for equal distributions, and for two sets it needs no covariance estimate
    (a Fréchet distance of a few dozen videos would)."""
    x, y = samples.float().flatten(1), base_samples.float().flatten(1)
    scale = x.shape[1] ** 0.5

    def mean_distance(a: Tensor, b: Tensor) -> Tensor:
        return torch.cdist(a, b).mean() / scale

    return 2.0 * mean_distance(x, y) - mean_distance(x, x) - mean_distance(y, y)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equally long sequences (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need two sequences of the same length >= 2, got {len(a)} and {len(b)}")
    ra, rb = _ranks(torch.tensor(a, dtype=torch.float64)), _ranks(torch.tensor(b, dtype=torch.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def _ranks(values: Tensor) -> Tensor:
    """1-based ranks, ties given their average rank."""
    order = values.argsort()
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=values.dtype)
    for value in values.unique():
        tied = values == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks

"""Exact rectified-flow velocities for Gaussian-mixture data, and the SDE samplers measured against exact marginals.

Data x0 ~ sum_j pi_j N(m_j, diag(s_j^2)) in d dimensions; rectified flow x_σ = (1 − σ)·x0 + σ·ε, ε ~ N(0, I). Each
component stays Gaussian along the path, so everything is closed form:

    p_σ(x)          = sum_j pi_j N(x; (1 − σ) m_j, diag((1 − σ)^2 s_j^2 + σ^2))
    E[x0 | x, j]    = m_j + (1 − σ) s_j^2 / ((1 − σ)^2 s_j^2 + σ^2) · (x − (1 − σ) m_j)
    v(x, σ)         = E[ε − x0 | x_σ = x] = (x − E[x0 | x]) / σ,   E[x0 | x] = sum_j w_j(x) E[x0 | x, j]

with responsibilities w_j(x) ∝ pi_j N(x; ...). This is the velocity a perfectly trained flow model would output,
so driving :func:`sage_grpo.sde.step` with it isolates the samplers' own discretisation error from any model error:
the Figure 9 analog of ``scripts/toy_study.py`` (:func:`noise_std_per_step`,
:func:`one_step_variance_errors`, :func:`terminal_errors`). The data is built to have a *manifold*: the components vary
in a few "on-manifold" coordinates and have a tiny std in the others, so the RMS of the off-manifold coordinates of a
sample measures how far a sampler leaves the data manifold (the exact flow ends there at ``OFF_MANIFOLD_STD``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from sage_grpo import sde
from sage_grpo.sde.schedule import all_step_sigmas

OFF_MANIFOLD_STD = 0.01


@dataclass
class GaussianMixture:
    """sum_j weights_j N(means_j, diag(stds_j^2)); means (J, d), stds (J, d), weights (J,), float64."""

    means: torch.Tensor
    stds: torch.Tensor
    weights: torch.Tensor
    manifold_dims: int  # the first ``manifold_dims`` coordinates are on the manifold, the rest off it

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    @classmethod
    def on_a_plane(cls, num_components: int = 4, dim: int = 16, manifold_dims: int = 2, radius: float = 1.0,
                   component_std: float = 0.15, seed: int = 0) -> "GaussianMixture":
        """Components on a circle in the first ``manifold_dims`` coordinates, std ``OFF_MANIFOLD_STD`` elsewhere."""
        generator = torch.Generator().manual_seed(seed)
        angles = torch.arange(num_components, dtype=torch.float64) * 2 * math.pi / num_components
        means = torch.zeros(num_components, dim, dtype=torch.float64)
        means[:, 0], means[:, 1] = radius * torch.cos(angles), radius * torch.sin(angles)
        if manifold_dims > 2:
            means[:, 2:manifold_dims] = 0.5 * torch.randn(num_components, manifold_dims - 2, generator=generator,
                                                           dtype=torch.float64)
        stds = torch.full((num_components, dim), OFF_MANIFOLD_STD, dtype=torch.float64)
        stds[:, :manifold_dims] = component_std
        weights = torch.full((num_components,), 1.0 / num_components, dtype=torch.float64)
        return cls(means, stds, weights, manifold_dims)

    def sample(self, num: int, generator: torch.Generator) -> torch.Tensor:
        """(num, d) float64 data samples."""
        component = torch.multinomial(self.weights, num, replacement=True, generator=generator)
        noise = torch.randn(num, self.dim, generator=generator, dtype=torch.float64)
        return self.means[component] + self.stds[component] * noise

    def marginal_sample(self, sigma: float, num: int, generator: torch.Generator) -> torch.Tensor:
        """(num, d) exact samples of x_σ."""
        x0 = self.sample(num, generator)
        return (1 - sigma) * x0 + sigma * torch.randn(x0.shape, generator=generator, dtype=torch.float64)

    def posterior_mean(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        """E[x0 | x_σ = x], (N, d) float64."""
        x = x.double()
        variance = (1 - sigma) ** 2 * self.stds**2 + sigma**2  # (J, d)
        centred = x.unsqueeze(1) - (1 - sigma) * self.means.unsqueeze(0)  # (N, J, d)
        log_density = (-0.5 * centred**2 / variance - 0.5 * torch.log(2 * math.pi * variance)).sum(-1)
        responsibility = torch.softmax(log_density + torch.log(self.weights), dim=1)  # (N, J)
        gain = (1 - sigma) * self.stds**2 / variance  # (J, d)
        component_means = self.means.unsqueeze(0) + gain.unsqueeze(0) * centred
        return (responsibility.unsqueeze(-1) * component_means).sum(1)

    def velocity(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        """v(x, σ) = (x − E[x0 | x]) / σ, (N, d) float64 (σ > 0)."""
        return (x.double() - self.posterior_mean(x, sigma)) / sigma

    def off_manifold_rms(self, x: torch.Tensor) -> float:
        """RMS of the off-manifold coordinates (the exact data has ``OFF_MANIFOLD_STD``)."""
        return float(x[:, self.manifold_dims:].double().pow(2).mean().sqrt())


def sliced_w2(a: torch.Tensor, b: torch.Tensor, num_projections: int = 64, seed: int = 0) -> float:
    """Sliced 2-Wasserstein distance between two equal-size samples (N, d): sorted 1-D projections."""
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(a.shape[1], num_projections, generator=generator, dtype=torch.float64)
    directions /= directions.norm(dim=0, keepdim=True)
    pa, _ = (a.double() @ directions).sort(dim=0)
    pb, _ = (b.double() @ directions).sort(dim=0)
    return float((pa - pb).pow(2).mean().sqrt())


def sde_step(mixture: GaussianMixture, kernel: sde.SDEKernel, eta: float, sigmas: torch.Tensor, index: int,
             x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x_{k+1} from x_k with the exact velocity and the project's SDE kernel (the one the GRPO rollout uses)."""
    velocity = mixture.velocity(x, float(sigmas[index])).float()
    return sde.step(kernel, velocity, x.float(), sigmas, index, eta, generator=generator).prev_sample.double()


def noise_std_per_step(sde_type: str, eta: float, sigmas: torch.Tensor) -> List[float]:
    """The std of the noise each step injects (what the log density divides by)."""
    _, noise_std = sde.get_kernel(sde_type).stds(all_step_sigmas(sigmas), eta)
    return [float(v) for v in noise_std]


def one_step_variance_errors(mixture: GaussianMixture, sde_type: str, eta: float, sigmas: torch.Tensor, num: int,
                              seed: int = 0) -> List[float]:
    """Per step k: one SDE step from exact samples of x_{σ_k}; the relative error of the variance of the
    off-manifold coordinates against the exact marginal's, (1 − σ_{k+1})^2 s^2 + σ_{k+1}^2 (0 = kept exactly).

    In those coordinates every component has mean 0 and std s, so the exact marginal there is N(0, that variance)
    whatever the responsibilities; the many coordinates x samples make the estimate sharp (~1/sqrt(14 num)).
    """
    errors, kernel = [], sde.get_kernel(sde_type)
    for k in range(sigmas.numel() - 1):
        generator = torch.Generator().manual_seed(seed + k)
        start = mixture.marginal_sample(float(sigmas[k]), num, generator)
        stepped = sde_step(mixture, kernel, eta, sigmas, k, start, generator)
        sigma_next = float(sigmas[k + 1])
        exact = (1 - sigma_next) ** 2 * OFF_MANIFOLD_STD**2 + sigma_next**2
        errors.append(float(stepped[:, mixture.manifold_dims:].pow(2).mean()) / exact - 1)
    return errors


def terminal_errors(mixture: GaussianMixture, sde_type: Optional[str], eta: float, sigmas: torch.Tensor, num: int,
                    seed: int = 0) -> Dict[str, float]:
    """Sample from σ = 1 to 0 (``sde_type`` None: the deterministic Euler ODE) and compare with the data."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num, mixture.dim, generator=generator, dtype=torch.float64)
    kernel = None if sde_type is None else sde.get_kernel(sde_type)
    for k in range(sigmas.numel() - 1):
        if sde_type is None:
            x = x + float(sigmas[k + 1] - sigmas[k]) * mixture.velocity(x, float(sigmas[k]))
        else:
            x = sde_step(mixture, kernel, eta, sigmas, k, x, generator)
    data = mixture.sample(num, generator)
    return {"sliced_w2": sliced_w2(x, data), "off_manifold_rms": mixture.off_manifold_rms(x),
            "data_off_manifold_rms": mixture.off_manifold_rms(data)}

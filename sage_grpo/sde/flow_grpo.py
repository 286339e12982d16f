"""Flow-GRPO's SDE (Liu et al. 2025; reference ``sde_type="flow_grpo"``).

    std_t = η·√(σ / (1 − σ̃)),  σ̃ = σ except σ̃ = σ_1 when σ = 1 (avoids the division by zero at the first step)
    μ     = x·(1 + std_t²·dt/(2σ)) + v·(1 + std_t²·(1 − σ)/(2σ))·dt
    x'    = μ + std_t·√(−dt)·ε,   noise_std = std_t·√(−dt)

The returned ``std`` (the reference's ``std_dev_t``) is std_t *without* √(−dt), exactly like the reference;
the mean-matching KL divides by it and is therefore mis-scaled by ≈ 1/|dt| for this type (docs/reference.md#d14).
``sde_solver`` is ignored: the mean always contains the correction.
"""
import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, StepSigmas, gaussian_log_density


def _std_t(sigmas: StepSigmas, eta: float) -> Tensor:
    """std_t = η·√(σ / (1 − σ̃)) with σ̃ = σ_1 at σ = 1."""
    sigma_tilde = torch.where(sigmas.sigma == 1, sigmas.sigma_1, sigmas.sigma)
    return torch.sqrt(sigmas.sigma / (1 - sigma_tilde)) * eta


def stds(sigmas: StepSigmas, eta: float) -> tuple[Tensor, Tensor]:
    std_t = _std_t(sigmas, eta)
    return std_t, std_t * torch.sqrt(-sigmas.dt)


def mean(x: Tensor, v: Tensor, sigmas: StepSigmas, eta: float, sde_solver: bool) -> Tensor:
    variance_t = _std_t(sigmas, eta) ** 2
    sigma, dt = sigmas.sigma, sigmas.dt
    return x * (1 + variance_t / (2 * sigma) * dt) + v * (1 + variance_t * (1 - sigma) / (2 * sigma)) * dt


KERNEL = SDEKernel(
    name="flow_grpo", stds=stds, mean=mean, log_density=gaussian_log_density, needs_positive_noise=True
)

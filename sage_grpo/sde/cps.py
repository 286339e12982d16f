"""Coefficients-Preserving Sampling (Wang & Yu 2025, FlowCPS; reference ``sde_type="cps"``).

DDIM-like: the next latent recombines the predicted clean sample and the predicted noise so that signal and
noise coefficients stay consistent with the flow marginal at σ':

    std_t = σ'·sin(η·π/2)
    x̂1    = x + (1 − σ)·v                                  predicted noise
    μ     = x̂0·(1 − σ') + x̂1·√(σ'² − std_t²)
    x'    = μ + std_t·ε,   noise_std = std_dev_t = std_t
    log p = −(x' − μ)²                                       no variance, no constants (as the reference)

σ'² − std_t² = σ'²·cos²(η·π/2) ≥ 0 mathematically; it is clamped at 0 so rounding can never take the square
root of a negative number. At the last step σ' = 0 and no noise is added. ``sde_solver`` is ignored.
"""
import math

import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, StepSigmas, pred_x0


def stds(sigmas: StepSigmas, eta: float) -> tuple[Tensor, Tensor]:
    std_t = sigmas.sigma_next * math.sin(eta * math.pi / 2)
    return std_t, std_t


def mean(x: Tensor, v: Tensor, sigmas: StepSigmas, eta: float, sde_solver: bool) -> Tensor:
    std_t, _ = stds(sigmas, eta)
    noise_estimate = x + v * (1 - sigmas.sigma)
    noise_coef = torch.sqrt(torch.clamp(sigmas.sigma_next**2 - std_t**2, min=0))
    return pred_x0(x, v, sigmas) * (1 - sigmas.sigma_next) + noise_estimate * noise_coef


def log_density(x_prev: Tensor, mean: Tensor, noise_std: Tensor) -> Tensor:
    """−(x' − μ)²: the reference drops the variance and every constant for cps."""
    return -((x_prev - mean) ** 2)


KERNEL = SDEKernel(name="cps", stds=stds, mean=mean, log_density=log_density, needs_positive_noise=False)

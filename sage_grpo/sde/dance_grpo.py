"""DanceGRPO's SDE (Xue et al. 2025; reference ``sde_type="dance_grpo"``).

First-order Euler–Maruyama with a constant noise level η:

    std = η·√(σ − σ')
    μ   = x + dt·v − ½·η²·s·dt        (sde_solver=True; equals x + dt·v + ½·η²·|dt|·s)
    μ   = x + dt·v                     (sde_solver=False)
    x'  = μ + std·ε,   noise_std = std_dev_t = std
"""
import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, StepSigmas, gaussian_log_density, solver_score


def stds(sigmas: StepSigmas, eta: float) -> tuple[Tensor, Tensor]:
    std = eta * torch.sqrt(sigmas.sigma - sigmas.sigma_next)
    return std, std


def mean(x: Tensor, v: Tensor, sigmas: StepSigmas, eta: float, sde_solver: bool) -> Tensor:
    drift = x + sigmas.dt * v
    if not sde_solver:
        return drift
    return drift + (-0.5 * eta**2 * solver_score(x, v, sigmas)) * sigmas.dt


KERNEL = SDEKernel(
    name="dance_grpo", stds=stds, mean=mean, log_density=gaussian_log_density, needs_positive_noise=True
)

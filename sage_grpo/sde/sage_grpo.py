"""SAGE-GRPO's precise manifold-aware SDE (paper §3.2.1, App. A.1; reference ``sde_type="sage_grpo"``).

The marginal-preserving SDE dx = [v − ½·g²·s] dt + g dW with g(σ)² = η²·σ/(1 − σ) is discretised with the
variance integrated exactly over [σ', σ] instead of the first-order g(σ)²·|dt| used by DanceGRPO/FlowGRPO:

    std² = η² · ∫_{σ'}^{σ} t/(1 − t) dt = η² · [ ln((1 − σ') / (1 − min(σ, 1 − 3e-3))) − (σ − σ') ]
    μ    = x + dt·v + ½·std²·s              (sde_solver=True: Itô correction with the solver score s)
    μ    = x + dt·v                          (sde_solver=False: no correction; not marginal-preserving)
    x'   = μ + std·ε,   noise_std = std_dev_t = std

The clamp of σ at 1 − 3e-3 (as in the reference) keeps the first step (σ = 1, where the integral diverges)
finite: with η = 0.5 on the 20-step shift-5 schedule std ≈ 0.556 at step 0 and ≈ 0.080 at step 19. The clamp
also makes std² negative on schedules whose σ' exceeds ≈ 1 − 3e-3 (e.g. several hundred steps);
``check_schedule`` rejects those, the reference would silently produce NaN.
"""
import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, StepSigmas, gaussian_log_density, solver_score

SIGMA_CLAMP = 1 - 3e-3  # upper clamp of σ inside the log term (reference value)


def _variance(sigmas: StepSigmas, eta: float) -> Tensor:
    """std² = η²·[ln((1 − σ')/(1 − min(σ, 1 − 3e-3))) − (σ − σ')]."""
    clamped_sigma = torch.clamp(sigmas.sigma, max=SIGMA_CLAMP)
    log_term = torch.log((1 - sigmas.sigma_next) / (1 - clamped_sigma))
    return eta**2 * (-(sigmas.sigma - sigmas.sigma_next) + log_term)


def stds(sigmas: StepSigmas, eta: float) -> tuple[Tensor, Tensor]:
    std = torch.sqrt(_variance(sigmas, eta))
    return std, std


def mean(x: Tensor, v: Tensor, sigmas: StepSigmas, eta: float, sde_solver: bool) -> Tensor:
    drift = x + sigmas.dt * v
    if not sde_solver:
        return drift
    return drift + 0.5 * _variance(sigmas, eta) * solver_score(x, v, sigmas)


KERNEL = SDEKernel(
    name="sage_grpo", stds=stds, mean=mean, log_density=gaussian_log_density, needs_positive_noise=True
)

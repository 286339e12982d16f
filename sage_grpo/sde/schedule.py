"""The shifted flow-matching sigma schedule (docs/reference.md#the-schedule-and-the-sde-steps) and its validation.

    u_k = 1 − k/N  (k = 0..N),   σ_k = shift·u_k / (1 + (shift − 1)·u_k),   t_k = 1000·σ_k  (k = 0..N−1)

For (N, shift) = (20, 5): σ = 1.0, 0.98958, 0.97826, ..., 0.20833, 0.0. u is built with float32
``torch.linspace(1, 0, N + 1)`` and shifted in float32, the reference scheduler's exact arithmetic.

``check_schedule`` is new (the reference has no such check and yields NaN log-probs instead): call it once per
run, it is not called inside ``step`` because it reads tensor values.
"""
import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, StepSigmas

NUM_TRAIN_TIMESTEPS = 1000  # t = 1000·σ is what the transformer receives


def shifted_sigmas(num_steps: int = 20, shift: float = 5.0) -> Tensor:
    """(num_steps + 1,) float32 σ schedule from 1 to 0 with the SD3 time shift."""
    if num_steps < 1 or shift <= 0:
        raise ValueError(f"need num_steps >= 1 and shift > 0, got num_steps={num_steps}, shift={shift}")
    u = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)
    return shift * u / (1 + (shift - 1) * u)


def timesteps_from_sigmas(sigmas: Tensor) -> Tensor:
    """(N,) float32 model timesteps t_k = 1000·σ_k for k = 0..N−1 (the final σ_N = 0 is never fed)."""
    return (sigmas[:-1] * NUM_TRAIN_TIMESTEPS).to(torch.float32)


def all_step_sigmas(sigmas: Tensor) -> StepSigmas:
    """Every step of a schedule at once: σ_k = sigmas[:-1], σ_{k+1} = sigmas[1:] (float64, on the host)."""
    schedule = sigmas.detach().to("cpu", torch.float64).flatten()
    return StepSigmas(schedule[:-1], schedule[1:], schedule[1])


def check_schedule(kernel: SDEKernel, sigmas: Tensor, eta: float) -> None:
    """ValueError unless ``sigmas`` is a usable schedule for ``kernel`` at noise level ``eta``.

    Requires 1 >= σ_0 > σ_1 > ... > σ_N >= 0 (so σ_k > 0 wherever the score divides by σ²) and, for the types
    whose log density divides by the noise variance, a finite positive noise std at every step: this rejects
    η = 0 and sage schedules whose σ' exceeds the 1 − 3e-3 clamp.
    """
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(f"sigmas must be a (N+1,) schedule with N >= 1, got shape {tuple(sigmas.shape)}")
    steps = all_step_sigmas(sigmas)
    ordered = bool(torch.all(steps.sigma > steps.sigma_next)) and steps.sigma[0] <= 1 and steps.sigma_next[-1] >= 0
    if not ordered:
        raise ValueError(f"sigmas must decrease strictly from <= 1 to >= 0, got {sigmas.tolist()}")
    if not kernel.needs_positive_noise:
        return
    _, noise_std = kernel.stds(steps, eta)
    bad_steps = (~(torch.isfinite(noise_std) & (noise_std > 0))).nonzero().flatten().tolist()
    if bad_steps:
        raise ValueError(
            f"{kernel.name} with eta={eta} has no positive finite noise std at steps {bad_steps}; "
            "use eta > 0 and (for sage_grpo) fewer steps or a smaller shift"
        )

"""Gradient-norm equalizer: one loss scale per diffusion step (paper §3.2.1, App. A.5;
docs/reference.md#the-gradient-norm-equalizer).

With μ_k depending on v through the per-element Jacobian J_k = ∂μ_k/∂v and noise std n_k, the expected
magnitude of ∂ log p/∂v at step k is proportional to

    g_k = |J_k| / max(n_k, 1e-12)           and the equalizer is   scale_k = median(g) / g_k.

μ is affine in (x, v) with μ(0, 0) = 0 for every type, so J_k is read off the kernel's own mean as μ(x=0, v=1)
(no second, hand-derived copy of each formula; the tests check it against autograd and against the spec's
table: dance dt·(1 + ½η²(1−σ)/σ), sage dt − ½·std²·(1−σ)/σ, flow dt·(1 + std_t²(1−σ)/(2σ)),
cps −σ(1−σ') + (1−σ)·√(σ'² − std_t²)).

Guards (reference): g_k = 1 where it is not finite or not positive; for types whose log density divides by the
variance (sage, dance, flow) g_k = 1 where the noise std is zero or undefined (the reference does this for
sage, std² <= 0 or σ = 0). torch.median is the lower median; a non-positive or non-finite median becomes 1.
g is computed in float64 on the host and stored float32, like the reference's Python floats.

With a window of trained steps (``--sde_window_size``), ``--sde_window_equalizer window`` renormalises the scales
over the window's steps, scale_k = median_window(g) / g_k (``window_scales``), so the window's median scale is 1
wherever it is; ``full`` (default) keeps the whole schedule's scales, which move the window's mean scale from
large (noisy steps) to small (clean steps) as it slides.

Departure: for dance/flow with η = 0 the reference floors n at 1e-12 (g ≈ |dt|·1e12); we give g = 1. Such a
configuration has no defined Gaussian log density and ``check_schedule`` rejects it. On valid schedules
(1 >= σ_0 > ... > σ_N >= 0, η > 0) the scales equal the reference's ``compute_grad_balancing_factors``.
"""
from typing import Optional

import torch
from torch import Tensor

from sage_grpo.sde.registry import get_kernel
from sage_grpo.sde.schedule import all_step_sigmas

_TINY = 1e-12


def grad_norm_proxies(sde_type: str, sigmas: Tensor, eta: Optional[float], sde_solver: bool = True) -> Tensor:
    """(N,) float32 g_k = |∂μ_k/∂v| / max(n_k, 1e-12), guarded to 1 where degenerate."""
    kernel = get_kernel(sde_type)
    eta = 1.0 if eta is None else float(eta)
    steps = all_step_sigmas(sigmas)
    jacobian = kernel.mean(torch.zeros_like(steps.sigma), torch.ones_like(steps.sigma), steps, eta, sde_solver)
    _, noise_std = kernel.stds(steps, eta)
    g = jacobian.abs() / noise_std.clamp(min=_TINY)
    valid = torch.isfinite(g) & (g > 0)
    if kernel.needs_positive_noise:
        valid &= torch.isfinite(noise_std) & (noise_std > 0)
    return torch.where(valid, g, torch.ones_like(g)).to(torch.float32)


def grad_balance_scales(sde_type: str, sigmas: Tensor, eta: Optional[float], sde_solver: bool = True) -> Tensor:
    """(N,) float32 scale_k = median(g) / g_k (lower median); eta None means 1.0 as in the reference."""
    g = grad_norm_proxies(sde_type, sigmas, eta, sde_solver)
    median = torch.median(g)
    if not (torch.isfinite(median) and median > 0):
        median = torch.ones((), dtype=g.dtype)
    return median / g


def window_scales(scales: Tensor, steps: Tensor) -> Tensor:
    """(N,) ``scales`` renormalised over the window ``steps``: median over the window of g, divided by g_k (with
    g_k = median(g) / scale_k this is scale_k times the lower median of 1 / scale over the window)."""
    return scales * torch.median(1.0 / scales[steps])

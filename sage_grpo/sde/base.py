"""The SDE-kernel interface, the step output and the math shared by the four samplers.

Notation (paper §3.2.1; docs/reference.md#the-schedule-and-the-sde-steps), all float32:

    x   = ``sample``        current latent x_t
    v   = ``model_output``  CFG-combined velocity v_θ(x_t, t)
    σ   = ``sigma``         σ_k ;  σ' = ``sigma_next`` σ_{k+1} ;  dt = σ' − σ < 0
    x̂0  = ``pred_x0``       x − σ·v
    s   = solver score      −(x − x̂0·(1 − σ)) / σ²  =  −x/σ − (1 − σ)·v/σ

A kernel is three pure functions of the step's sigmas and η: the noise scales, the transition mean μ and the
per-element log density of x' under N(μ, noise_std²). Each of ``sage_grpo.py``, ``dance_grpo.py``,
``flow_grpo.py`` and ``cps.py`` builds one ``SDEKernel``; ``registry.py`` maps names to their modules.
"""
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class StepSigmas:
    """σ_k and σ_{k+1} of the step(s) being taken, broadcastable to x; σ_1 is the schedule's second entry."""

    sigma: Tensor  # σ_k: () for one shared step, (B, 1, ..., 1) for per-sample steps
    sigma_next: Tensor  # σ_{k+1}, same shape as sigma
    sigma_1: Tensor  # () σ_1; flow_grpo uses it in place of σ when σ = 1

    @property
    def dt(self) -> Tensor:
        """dt = σ' − σ (< 0 on a decreasing schedule)."""
        return self.sigma_next - self.sigma


@dataclass(frozen=True)
class SDEKernel:
    """One SDE type. ``needs_positive_noise``: its log density divides by the noise variance.

    stds(sigmas, eta) -> (std_dev_t, noise_std): the reference's returned ``std_dev_t`` (what the
        mean-matching KL divides by) and the std of the noise actually added to μ.
    mean(x, v, sigmas, eta, sde_solver) -> μ, affine in (x, v) with μ(0, 0) = 0.
    log_density(x_prev, mean, noise_std) -> per-element log p(x' | μ, noise_std).
    """

    name: str
    stds: Callable[[StepSigmas, float], tuple[Tensor, Tensor]]
    mean: Callable[[Tensor, Tensor, StepSigmas, float, bool], Tensor]
    log_density: Callable[[Tensor, Tensor, Tensor], Tensor]
    needs_positive_noise: bool


@dataclass
class SDEStepOutput:
    """Result of one SDE step; every tensor is float32.

    prev_sample: (B, ...) x' (drawn, Euler, or the given stored latent), detached.
    pred_x0: (B, ...) x̂0 = x − σ·v.
    log_prob: (B,) mean over the non-batch elements of the per-element log density of x'.
    mean: (B, ...) μ_θ; gradients reach ``model_output`` through it.
    std: () or (B,) the reference's ``std_dev_t`` (flow_grpo: without the √(−dt) factor).
    noise_std: () or (B,) std of the added noise, the scale inside the log density.
    """

    prev_sample: Tensor
    pred_x0: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor
    noise_std: Tensor


def pred_x0(x: Tensor, v: Tensor, sigmas: StepSigmas) -> Tensor:
    """x̂0 = x − σ·v, the clean-sample estimate of a rectified-flow velocity."""
    return x - sigmas.sigma * v


def solver_score(x: Tensor, v: Tensor, sigmas: StepSigmas) -> Tensor:
    """Score estimate s = −(x − x̂0·(1 − σ)) / σ² used by the sde_solver correction (Itô term)."""
    return -(x - pred_x0(x, v, sigmas) * (1 - sigmas.sigma)) / (sigmas.sigma**2)


def gaussian_log_density(x_prev: Tensor, mean: Tensor, noise_std: Tensor) -> Tensor:
    """Per-element log N(x'; μ, n²) = −(x' − μ)²/(2n²) − log n − log √(2π)."""
    return -((x_prev - mean) ** 2) / (2 * noise_std**2) - torch.log(noise_std) - _LOG_SQRT_2PI

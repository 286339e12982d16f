"""One stateless SDE step: the same kernel draws a rollout transition and re-scores a stored one.

``step`` takes the full (N+1,) sigma schedule and an explicit step index (an int, or a (B,) LongTensor with one
index per sample), so a stored transition (x_k, x_{k+1}) is re-scored from data alone; there is no hidden step
counter and no float matching of timesteps (the reference looks the step up by exact equality of t).

All math is float32 whatever the input dtype (docs/reference.md#the-schedule-and-the-sde-steps); the per-step
coefficients are computed on the sample's device. The log density is averaged, not summed, over the non-batch elements
(one scalar per sample), and x' enters it detached, so gradients reach ``model_output`` only through μ.

Departures from the reference:
- ``generator`` may be None (global RNG, what the reference uses for SDE noise, docs/reference.md#d10), one
  torch.Generator, or a list of B generators so that every sample's SDE noise can be seeded on its own; or the
  caller draws ε itself and passes it as ``noise`` (the rollout draws a whole trajectory's ε at once and moves it to
  the device in one copy).
- ``prev_sample`` is returned detached: it is an action / stored datum, never a differentiable output.
- ``deterministic=True`` together with a ``prev_sample`` raises ValueError (the reference silently replaces
  the given latent by the Euler step).
- The step performs no data-dependent checks, which would force a device sync on every call; validate the
  schedule once with ``sage_grpo.sde.check_schedule``. An out-of-range tensor index fails in the indexing.
"""
import operator
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from sage_grpo.sde.base import SDEKernel, SDEStepOutput, StepSigmas, pred_x0

Generators = Union[None, torch.Generator, Sequence[torch.Generator]]


def _step_sigmas(sigmas: Tensor, index: Union[int, Tensor], x: Tensor) -> StepSigmas:
    """σ_k, σ_{k+1} as () for an int index or (B, 1, ..., 1) for a per-sample index, float32 on x's device."""
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(f"sigmas must be the full (N+1,) schedule, got shape {tuple(sigmas.shape)}")
    schedule = sigmas.detach().to(device=x.device, dtype=torch.float32)
    num_steps = schedule.numel() - 1
    if isinstance(index, Tensor):
        if index.shape != (x.shape[0],) or index.is_floating_point() or index.dtype == torch.bool:
            raise ValueError(f"a tensor index must be an integer (B,) = ({x.shape[0]},) tensor, got {index}")
        per_sample = index.to(x.device)
        broadcast = (-1,) + (1,) * (x.ndim - 1)
        return StepSigmas(schedule[per_sample].view(broadcast), schedule[per_sample + 1].view(broadcast), schedule[1])
    step_index = operator.index(index)
    if not 0 <= step_index < num_steps:
        raise ValueError(f"step index {step_index} is outside [0, {num_steps}) for a {num_steps}-step schedule")
    return StepSigmas(schedule[step_index], schedule[step_index + 1], schedule[1])


def _standard_normal(like: Tensor, generator: Generators) -> Tensor:
    """ε ~ N(0, I) float32 shaped like ``like``; drawn on each generator's own device, then moved."""
    if generator is None:
        return torch.randn(like.shape, device=like.device, dtype=torch.float32)
    if isinstance(generator, torch.Generator):
        eps = torch.randn(like.shape, generator=generator, device=generator.device, dtype=torch.float32)
        return eps.to(like.device)
    if len(generator) != like.shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {like.shape[0]}")
    per_sample = [torch.randn(like.shape[1:], generator=g, device=g.device, dtype=torch.float32) for g in generator]
    return torch.stack(per_sample).to(like.device)


def _per_sample(coef: Tensor, index: Union[int, Tensor]) -> Tensor:
    """A broadcast coefficient back to () (shared step) or (B,) (per-sample steps)."""
    return coef.reshape(-1) if isinstance(index, Tensor) else coef


def step(
    kernel: SDEKernel,
    model_output: Tensor,
    sample: Tensor,
    sigmas: Tensor,
    index: Union[int, Tensor],
    eta: float,
    *,
    prev_sample: Optional[Tensor] = None,
    generator: Generators = None,
    noise: Optional[Tensor] = None,
    deterministic: bool = False,
    sde_solver: bool = True,
) -> SDEStepOutput:
    """One transition x_k -> x_{k+1} of ``kernel`` and the log density of x_{k+1}.

    kernel: the SDE, resolved once from its name by the caller (``sde.get_kernel``; the ``Sampler`` holds it), so
    no step looks it up.

    model_output: (B, ...) CFG-combined velocity v; sample: (B, ...) current latent x (any float dtype).
    sigmas: (N+1,) schedule; index: step k, an int or a (B,) integer tensor; eta: noise level η.
    prev_sample: the stored x_{k+1} to re-score (detached); None draws x' = μ + noise_std·ε from ``generator``.
    noise: ε (B, ...) fp32 on the sample's device, drawn by the caller; then ``generator`` must be None.
    deterministic: x' = x + dt·v (plain Euler), log_prob still taken w.r.t. the SDE mean.
    sde_solver: include the score (Itô) correction in μ; only sage_grpo and dance_grpo use it.
    """
    if model_output.shape != sample.shape or sample.ndim < 2:
        raise ValueError(
            f"model_output {tuple(model_output.shape)} and sample {tuple(sample.shape)} must be equal (B, ...)"
        )
    if deterministic and prev_sample is not None:
        raise ValueError("deterministic=True draws the Euler step; do not also pass prev_sample")
    if noise is not None and generator is not None:
        raise ValueError("pass the SDE noise or a generator to draw it from, not both")
    x, v = sample.float(), model_output.float()
    step_sigmas = _step_sigmas(sigmas, index, x)
    mean = kernel.mean(x, v, step_sigmas, eta, sde_solver)
    std_dev_t, noise_std = kernel.stds(step_sigmas, eta)
    if prev_sample is not None:
        if prev_sample.shape != sample.shape:
            raise ValueError(f"prev_sample {tuple(prev_sample.shape)} must match sample {tuple(sample.shape)}")
        next_sample = prev_sample.detach().float()
    elif deterministic:
        next_sample = (x + step_sigmas.dt * v).detach()
    else:
        eps = noise.float() if noise is not None else _standard_normal(x, generator)
        next_sample = (mean + noise_std * eps).detach()
    log_prob = kernel.log_density(next_sample, mean, noise_std).mean(dim=tuple(range(1, x.ndim)))
    return SDEStepOutput(
        prev_sample=next_sample,
        pred_x0=pred_x0(x, v, step_sigmas),
        log_prob=log_prob,
        mean=mean,
        std=_per_sample(std_dev_t, index),
        noise_std=_per_sample(noise_std, index),
    )

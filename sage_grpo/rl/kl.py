"""KL terms of the dual trust region (paper §3.2.2, App. A.6; docs/reference.md#the-kl-terms-and-the-controller).

Position control, the mean-matching KL to a reference (fixed base model or periodically refreshed "moving
anchor"): the KL between two isotropic Gaussians with the same std, averaged per element,

    KL_pos = mean_b [ mean_elems (μ_θ − μ_ref)² / (2·(std² + 1e-6)) ]       ``mean_matching_kl``

Velocity control, the step-wise KL to the previous optimisation step's policy (paper eq. 12, 15: π_{θ_{k−1}}, the
policy before this optimizer update), a one-sample estimate on the rollout's transitions:

    KL_step = mean_b (log π_prev − log π_θ)                                 ``stepwise_kl``

With one optimizer update per rollout (the reference) π_prev is the rollout's policy and log π_prev the log-prob
stored at rollout time. With several (``--num_inner_epochs K > 1``) the policy before a later update is the current
one, so log π_prev is the replayed log-prob itself, detached: KL_step is 0 in value and its gradient is −∇ log π_θ,
exactly as at K = 1. ``--stepwise_kl_reference rollout`` measures the later epochs against the rollout's policy
instead (the drift since the rollout, which the adaptive β then sees); ``KLMode.stepwise_to_rollout``.

    KL_eff = w_pos·KL_pos + w_step·KL_step (dual; w = 1.0, 0.1)  or  KL_pos   ``dual_kl``

``std`` is the sampler's returned ``std_dev_t`` as in the reference: for flow_grpo it lacks the √(−dt) factor,
for cps it is 0 at the last step (denominator 2e-6); see docs/reference.md#d14.

KL modes (the README's KL ablation), chosen by (kl_weight, use_moving_KL, use_dual_kl): kl_weight = 0 is "none"
(no reference model is loaded), and so is a β that stays 0 (``kl_mode_of``), otherwise the table ``KL_MODES``
below. "Step-wise only" has no flag in the reference; the closest is a dual mode with moving weight 0, which still
needs the reference model.
"""
from dataclasses import dataclass, replace
from typing import Protocol, Union

from torch import Tensor

from sage_grpo.rl.kl_controllers import stays_zero


class KLOptions(Protocol):
    """What the KL mode is decided from: the configuration's ``trust_region`` section (declared here by shape, so the
    GRPO math imports no configuration)."""

    kl_weight: float
    kl_coef: float
    kl_min_coef: float
    use_moving_KL: bool
    use_dual_kl: bool
    stepwise_kl_reference: str
    kl_controller: str

KL_STD_EPS = 1e-6


@dataclass(frozen=True)
class KLMode:
    """One KL configuration: whether it uses the reference model, refreshes it, and adds the step-wise term."""

    name: str
    uses_reference: bool
    moving_anchor: bool
    dual: bool
    stepwise_to_rollout: bool = False  # --stepwise_kl_reference rollout (dual modes): π_prev = the rollout's policy


KL_MODES: dict[tuple[bool, bool], KLMode] = {  # (use_moving_KL, use_dual_kl) -> mode, for kl_weight > 0
    (False, False): KLMode("fixed", uses_reference=True, moving_anchor=False, dual=False),
    (True, False): KLMode("moving", uses_reference=True, moving_anchor=True, dual=False),
    (False, True): KLMode("dual_fixed", uses_reference=True, moving_anchor=False, dual=True),
    (True, True): KLMode("dual_moving", uses_reference=True, moving_anchor=True, dual=True),
}
NO_KL = KLMode("none", uses_reference=False, moving_anchor=False, dual=False)


def resolve_kl_mode(kl_weight: float, use_moving_kl: bool, use_dual_kl: bool) -> KLMode:
    """The KLMode of a flag combination; kl_weight = 0 switches KL (and the reference model) off."""
    if kl_weight < 0:
        raise ValueError(f"kl_weight must be >= 0, got {kl_weight}")
    if kl_weight == 0:
        return NO_KL
    return KL_MODES[(bool(use_moving_kl), bool(use_dual_kl))]


def kl_mode_of(options: KLOptions) -> KLMode:
    """The run's KL mode from ``--kl_weight``, ``--use_moving_KL`` and ``--use_dual_kl``: decided once (the trainer,
    the memory plan) and handed to everything that depends on it (model building, resume checks, the update).
    A controller whose β stays 0 for the whole run is "none" too (``--kl_controller adaptive`` with ``--kl_coef 0
    --kl_min_coef 0``: the reference computes the KL only while β > 0, ``kl_controller.beta_stays_zero``; it still
    loads its reference model, which goes unused)."""
    if stays_zero(options):
        return NO_KL
    mode = resolve_kl_mode(options.kl_weight, options.use_moving_KL, options.use_dual_kl)
    return replace(mode, stepwise_to_rollout=options.stepwise_kl_reference == "rollout") if mode.dual else mode


def kl_mode(kl_weight: float, use_moving_kl: bool, use_dual_kl: bool) -> str:
    """Name of the KL mode: "none", "fixed", "moving", "dual_fixed" or "dual_moving"."""
    return resolve_kl_mode(kl_weight, use_moving_kl, use_dual_kl).name


def mean_matching_kl(mean: Tensor, ref_mean: Tensor, std: Union[float, Tensor]) -> Tensor:
    """0-d KL_pos for (B, ...) means; ``std`` is a scalar or a (B,) per-sample std_dev_t."""
    if mean.shape != ref_mean.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and ref_mean {tuple(ref_mean.shape)} must have the same shape")
    per_sample = ((mean.float() - ref_mean.float()) ** 2).mean(dim=tuple(range(1, mean.ndim)))  # (B,)
    return (per_sample / (2 * (std**2 + KL_STD_EPS))).mean()


def stepwise_kl(old_log_prob: Tensor, new_log_prob: Tensor) -> Tensor:
    """0-d KL_step = mean(old − new) with old = log π_prev: ≈ 0 in value on-policy, but its gradient is −∇ log π_θ."""
    return (old_log_prob - new_log_prob).mean()


def dual_kl(
    mean: Tensor,
    ref_mean: Tensor,
    std: Union[float, Tensor],
    old_log_prob: Tensor,
    new_log_prob: Tensor,
    use_dual_kl: bool,
    moving_weight: float = 1.0,
    step_weight: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(KL_eff, parts): parts holds detached "kl_moving" and, in dual modes only, "kl_stepwise".

    Without use_dual_kl, KL_eff = KL_pos unweighted (the reference applies ``moving_weight`` only in dual mode).
    """
    kl_moving = mean_matching_kl(mean, ref_mean, std)
    if not use_dual_kl:
        return kl_moving, {"kl_moving": kl_moving.detach()}
    kl_step = stepwise_kl(old_log_prob, new_log_prob)
    effective = moving_weight * kl_moving + step_weight * kl_step
    return effective, {"kl_moving": kl_moving.detach(), "kl_stepwise": kl_step.detach()}

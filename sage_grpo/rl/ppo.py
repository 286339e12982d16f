"""PPO-clipped GRPO policy loss for one diffusion step of a mini-batch (paper Eq. GRPO objective;
docs/reference.md#the-policy-loss).

    A_i   = clamp(Â_i, −adv_clip_max, adv_clip_max)
    r_i   = exp(log π_θ(x'_i | x_i) − log π_old(x'_i | x_i))          ``new_log_prob − old_log_prob``
    L_i   = max(−A_i·r_i, −A_i·clamp(r_i, 1 − c, 1 + c)) · w_i         c = ``clip_range`` (1e-4)
    loss  = mean_i L_i

w_i (``scale``) is the gradient-norm equalizer factor of the sample's original diffusion step (paper App. A.5);
it multiplies each sample's loss before the batch mean, as in the reference.

Metrics are 0-d detached tensors, not Python floats: converting would force one device sync per inner
iteration (40 per optimizer step); the caller reduces them once per step.
"""
from typing import Optional

import torch
from torch import Tensor


def ppo_clipped_loss(
    new_log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_range: float = 1e-4,
    adv_clip_max: float = 5.0,
    scale: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) for (B,) log-probs and advantages; ``scale`` is an optional (B,) per-sample factor.

    metrics: approx_kl = ½·mean((new − old)²), clipfrac = mean(|r − 1| > c), clipfrac_gt_one = mean(r > 1 + c),
    clipfrac_lt_one = mean(r < 1 − c), policy_loss, ratio_mean.
    """
    if not new_log_prob.shape == old_log_prob.shape == advantages.shape or new_log_prob.ndim != 1:
        raise ValueError(
            f"log-probs and advantages must all be (B,), got {tuple(new_log_prob.shape)}, "
            f"{tuple(old_log_prob.shape)}, {tuple(advantages.shape)}"
        )
    clipped_adv = advantages.clamp(min=-adv_clip_max, max=adv_clip_max)
    log_ratio = new_log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped_loss = -clipped_adv * ratio
    clipped_loss = -clipped_adv * ratio.clamp(min=1 - clip_range, max=1 + clip_range)
    per_sample = torch.maximum(unclipped_loss, clipped_loss)
    if scale is not None:
        per_sample = per_sample * scale
    loss = per_sample.mean()
    ratio_d = ratio.detach()
    metrics = {
        "approx_kl": 0.5 * (log_ratio.detach() ** 2).mean(),
        "clipfrac": ((ratio_d - 1).abs() > clip_range).float().mean(),
        "clipfrac_gt_one": (ratio_d > 1 + clip_range).float().mean(),
        "clipfrac_lt_one": (ratio_d < 1 - clip_range).float().mean(),
        "policy_loss": loss.detach(),
        "ratio_mean": ratio_d.mean(),
    }
    return loss, metrics

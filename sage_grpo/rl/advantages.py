"""Group-relative advantages (paper §3.1 and App. A.4; docs/reference.md#advantages).

For the G rollouts r_1..r_G of one prompt, the advantage of rollout i is its population z-score

    Â_i = (r_i − mean(r)) / max(std_pop(r), eps),   eps = 1e-6,

used clipped to ±adv_clip_max (5) in the PPO loss. Rewards are laid out so every group is contiguous.

Departure from the reference: a non-finite reward (a failed reward call) is excluded from its group's mean and
std and gets advantage 0; the other members are normalized among themselves. The reference turns NaN/±inf
into a reward of 0 *before* normalizing (docs/reference.md#d18), so a failure acts as a real, usually very low, reward
and pushes its siblings' advantages up. A group without any finite reward gets all-zero advantages.

Several rewards (``--reward_aggregation``). The reward is a weighted sum of terms r_k (VideoAlign's VQ, MQ, TA with
``--reward_weights``, or the metrics of several models), ``avg = Σ_k w_k r_k``. Two ways to turn them into advantages:

    sum        Â_i = Â(avg)_i                   normalize the weighted sum (the reference, Flow-GRPO)
    advantage  Â_i = Σ_k w_k Â(r_k)_i           normalize each term in its group, then weigh (DanceGRPO, GDPO-like)

``advantage`` keeps a term with a small spread (TA varies less than VQ within a prompt's group) from being drowned
by one with a large spread. Failed samples are the same in both modes: a sample is failed when any term is
non-finite (then ``avg`` is NaN too: the failure policy NaNs every metric of a failed reward model, and w·NaN is NaN
even for w = 0); it is excluded from the mean and std of *every* term and gets advantage 0, exactly as ``sum``
excludes it through ``avg``.
"""
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """(N,) -> (N / group_size, group_size) float32; ValueError if the groups do not tile N."""
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be (N,) with N a multiple of group_size={group_size}, got {tuple(rewards.shape)}"
        )
    return rewards.float().view(-1, group_size)


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """(N,) per-group population z-scores of ``rewards``; non-finite rewards are excluded and get 0."""
    grouped = _grouped(rewards, group_size)
    finite = torch.isfinite(grouped)
    values = torch.where(finite, grouped, torch.zeros_like(grouped))
    count = finite.sum(dim=1, keepdim=True).clamp(min=1)
    mean = values.sum(dim=1, keepdim=True) / count
    variance = torch.where(finite, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=1, keepdim=True) / count
    advantages = (values - mean) / variance.sqrt().clamp(min=eps)
    return torch.where(finite, advantages, torch.zeros_like(advantages)).view(-1)


def sum_then_normalize(rewards: Mapping[str, Tensor], term_weights: Mapping[str, float], group_size: int) -> Tensor:
    """``sum``: group advantages of the weighted sum ``rewards["avg"]`` (the weights are already in it)."""
    return group_advantages(rewards["avg"], group_size)


def normalize_then_sum(rewards: Mapping[str, Tensor], term_weights: Mapping[str, float], group_size: int) -> Tensor:
    """``advantage``: Σ_k w_k Â(r_k) over ``term_weights`` {key: w_k}; a sample with any non-finite term is failed in
    every term (excluded from the group statistics, advantage 0)."""
    missing = sorted(set(term_weights) - set(rewards))
    if missing:
        raise KeyError(f"reward terms {missing} of the advantage aggregation are not among the rewards "
                       f"{sorted(rewards)}")
    terms = torch.stack([rewards[key].float() for key in term_weights])  # (K, N)
    failed = ~torch.isfinite(terms).all(dim=0)
    terms = terms.masked_fill(failed, torch.nan)
    total = torch.zeros(terms.shape[1])
    for weight, term in zip(term_weights.values(), terms):
        total += weight * group_advantages(term, group_size)
    return total


REWARD_AGGREGATIONS: dict[str, Callable[[Mapping[str, Tensor], Mapping[str, float], int], Tensor]] = {
    "sum": sum_then_normalize,
    "advantage": normalize_then_sum,
}


@dataclass(frozen=True)
class RewardAggregation:
    """``--reward_aggregation`` decided once: ``aggregation(rewards, group_size) -> (N,)`` advantages."""

    mode: str = "sum"
    term_weights: Mapping[str, float] | None = None  # output key -> w_k, with avg = Σ_k w_k r_k; needed by advantage

    def __post_init__(self):
        if self.mode not in REWARD_AGGREGATIONS:
            raise ValueError(f"reward_aggregation {self.mode!r} is not one of {sorted(REWARD_AGGREGATIONS)}")
        if self.mode == "advantage" and not self.term_weights:
            raise ValueError("reward_aggregation 'advantage' needs the weights of the reward terms")

    def __call__(self, rewards: Mapping[str, Tensor], group_size: int) -> Tensor:
        return REWARD_AGGREGATIONS[self.mode](rewards, self.term_weights or {}, group_size)


def local_advantages(
    rewards: Mapping[str, Tensor],
    group_size: int,
    ranks_per_group: int,
    rank_in_group: int,
    batch_size: int,
    aggregation: RewardAggregation = RewardAggregation(),
) -> Tensor:
    """(batch_size,) advantages of this rank's samples, for both rank layouts of docs/reference.md#advantages.

    ``rewards``: reward key -> values, ``"avg"`` among them, aggregated by ``aggregation``.
    ranks_per_group == 1: the values are this rank's (B,) samples holding B / group_size whole groups.
    ranks_per_group > 1: one group spans ``ranks_per_group`` ranks of B samples each (group_size = rpg·B);
        the values are the whole gathered (group_size,) group in rank order and this rank's slice
        [rank_in_group·B, (rank_in_group + 1)·B) of the group's advantages is returned.
    """
    shape = rewards["avg"].shape
    if shape != ((batch_size,) if ranks_per_group == 1 else (group_size,)):
        raise ValueError(f"rewards {tuple(shape)} do not fit ranks_per_group={ranks_per_group}, B={batch_size}")
    if ranks_per_group == 1:
        return aggregation(rewards, group_size)
    if group_size != ranks_per_group * batch_size or not 0 <= rank_in_group < ranks_per_group:
        raise ValueError(
            f"a group spread over ranks needs group_size = ranks_per_group * batch_size and "
            f"0 <= rank_in_group < ranks_per_group; got {group_size}, {ranks_per_group}, {batch_size}, {rank_in_group}"
        )
    start = rank_in_group * batch_size
    return aggregation(rewards, group_size)[start : start + batch_size]


def clip_advantages(advantages: Tensor, max_abs: float) -> Tensor:
    """Advantages clamped to [−max_abs, max_abs] (the reference's adv_clip_max = 5)."""
    return advantages.clamp(min=-max_abs, max=max_abs)


def zero_spread_fraction(rewards: Tensor, group_size: int) -> Tensor:
    """0-d fraction of groups whose finite rewards are all equal (no learning signal); empty groups count."""
    grouped = _grouped(rewards, group_size)
    finite = torch.isfinite(grouped)
    highest = torch.where(finite, grouped, torch.full_like(grouped, -torch.inf)).amax(dim=1)
    lowest = torch.where(finite, grouped, torch.full_like(grouped, torch.inf)).amin(dim=1)
    no_spread = ~(highest > lowest)
    return no_spread.float().mean()


def reward_statistics(rewards: Mapping[str, Tensor], group_size: int) -> dict[str, float]:
    """The step's reward metrics, ``rewards`` holding all B x dp samples (prompt groups contiguous): mean and std of
    each term's finite values (``ori_avg``: ``avg`` again, as the reference logs it), the fraction of groups with no
    spread, and the number of failed (NaN) rewards."""
    metrics: dict[str, float] = {}
    for name, values in {**rewards, "ori_avg": rewards["avg"]}.items():
        finite = values[torch.isfinite(values)].float()
        metrics[f"gathered_{name}_reward_mean"] = float(finite.mean()) if finite.numel() else math.nan
        metrics[f"gathered_{name}_reward_std"] = float(finite.std(unbiased=False)) if finite.numel() else math.nan
    metrics["zero_std_group_fraction"] = float(zero_spread_fraction(rewards["avg"], group_size))
    metrics["failed_reward_count"] = float((~torch.isfinite(rewards["avg"])).sum())
    return metrics

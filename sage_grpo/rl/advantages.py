"""Group-relative advantages (paper §3.1 and App. A.4; spec §2.8).

For the G rollouts r_1..r_G of one prompt, the advantage of rollout i is its population z-score

    Â_i = (r_i − mean(r)) / max(std_pop(r), eps),   eps = 1e-6,

used clipped to ±adv_clip_max (5) in the PPO loss. Rewards are laid out so every group is contiguous.

Departure from the reference: a non-finite reward (a failed reward call) is excluded from its group's mean and
std and gets advantage 0; the other members are normalized among themselves. The reference turns NaN/±inf
into a reward of 0 *before* normalizing (spec §10.18), so a failure acts as a real, usually very low, reward
and pushes its siblings' advantages up. A group without any finite reward gets all-zero advantages.
"""
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


def local_advantages(
    rewards: Tensor, group_size: int, ranks_per_group: int, rank_in_group: int, batch_size: int
) -> Tensor:
    """(batch_size,) advantages of this rank's samples, for both rank layouts of spec §2.8.

    ranks_per_group == 1: ``rewards`` is this rank's (B,) tensor holding B / group_size whole groups.
    ranks_per_group > 1: one group spans ``ranks_per_group`` ranks of B samples each (group_size = rpg·B);
        ``rewards`` is the whole gathered (group_size,) group in rank order and this rank's slice
        [rank_in_group·B, (rank_in_group + 1)·B) of the group's advantages is returned.
    """
    if rewards.shape != ((batch_size,) if ranks_per_group == 1 else (group_size,)):
        raise ValueError(f"rewards {tuple(rewards.shape)} do not fit ranks_per_group={ranks_per_group}, B={batch_size}")
    if ranks_per_group == 1:
        return group_advantages(rewards, group_size)
    if group_size != ranks_per_group * batch_size or not 0 <= rank_in_group < ranks_per_group:
        raise ValueError(
            f"a group spread over ranks needs group_size = ranks_per_group * batch_size and "
            f"0 <= rank_in_group < ranks_per_group; got {group_size}, {ranks_per_group}, {batch_size}, {rank_in_group}"
        )
    start = rank_in_group * batch_size
    return group_advantages(rewards, group_size)[start : start + batch_size]


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

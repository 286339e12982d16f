"""Keeping the GRPO step consistent across ranks (docs/reference.md#advantages, docs/reference.md#step-metrics,
docs/reference.md#randomness-across-ranks): rollouts and rewards inside an SP group, prompt groups spread over several
data-parallel ranks, reward statistics, and rank-0-only file work.

Every function is a no-op on one process and must be called by every rank of the group it names at the same point.

- Inside an SP group the prompts, seeds, SDE-noise generators, sample shuffle and timestep permutations are derived
  from (seed, dp_rank, step), so they are identical by construction; :func:`check_same_in_sp_group` asserts it once
  per step (a few integers). The rollout itself is identical too (every SP rank ends each transformer call with the
  same all-gathered velocity); :func:`share_rollout` nevertheless broadcasts the stored latents and log-probs from
  the SP leader, so that the training pass of every SP rank replays the very same transitions whatever the kernels
  do (one broadcast of B x (N+1) latents per step, small next to the rollout). The reference relies on identical RNG
  consumption alone (docs/reference.md#d11).
- Rewards are scored once per SP group, on its leader, and broadcast (:func:`share_rewards`); the other SP ranks
  never build a reward model.
- A prompt group of G samples spanning ``ranks_per_group > 1`` DP ranks is gathered (:func:`gather_group_rewards`,
  DP-rank order) so that every member normalizes over the whole group and keeps its slice
  (``rl.local_advantages``).
- Reward statistics are taken over the step's ``B x dp`` samples, gathered once over the DP group
  (:func:`gather_step_rewards`): no SP or group duplicates.
"""

from typing import Any, Callable, Dict, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from sage_grpo.distributed.collectives import (all_gather_in_group, broadcast_from_sp_leader,
                                               broadcast_object_from_sp_leader)
from sage_grpo.distributed.parallel_dims import ParallelDims

T = TypeVar("T")


def run_on_main(fn: Callable[[], T], dims: ParallelDims) -> T:
    """Run ``fn`` on rank 0 only and return its result on every rank; an exception it raises is raised on every rank.

    For file-system work whose outcome all ranks need (creating the run directory), so that a refusal on rank 0
    stops the whole job instead of leaving the other ranks waiting in their next collective.
    """
    if not dims.is_distributed:
        return fn()
    outcome = [None]
    if dims.is_main:
        try:
            outcome[0] = (True, fn())
        except Exception as err:  # re-raised below, on every rank
            outcome[0] = (False, err)
    dist.broadcast_object_list(outcome, src=0, device=dims.device if dims.device.type == "cuda" else None)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def check_same_in_sp_group(dims: ParallelDims, **values: Any) -> None:
    """Raise if any of the (picklable, comparable) ``values`` differs from the SP leader's copy."""
    if not (dims.sp_enabled and dist.is_initialized()):
        return
    gathered = [None] * dims.sp_size
    dist.all_gather_object(gathered, values, group=dims.sp_group)
    differing = sorted(k for k in values if any(other[k] != gathered[0][k] for other in gathered[1:]))
    if differing:
        raise RuntimeError(f"SP ranks {dims.sp_group_ranks} disagree on {differing}: every rank of an SP group must "
                           "see the same samples, seeds and permutations (derive them from dp_rank, not rank)")


def share_rollout(rollout, dims: ParallelDims) -> None:
    """Overwrite the stored latents and log-probs with the SP leader's (in place)."""
    broadcast_from_sp_leader(rollout.latents, dims)
    broadcast_from_sp_leader(rollout.log_probs, dims)


def decode_across_sp_group(decode: Callable[[torch.Tensor], torch.Tensor], latents: torch.Tensor,
                           video_shape: Sequence[int], dims: ParallelDims) -> Optional[torch.Tensor]:
    """The (B, 3, F, H, W) videos of the SP group's final ``latents`` (identical on its ranks), decoded by the group's
    ranks together: SP rank r decodes samples r, r + sp, ... and the SP leader gets all of them (the others None).

    Without SP the leader decodes everything. ``video_shape`` is one decoded video's (3, F, H, W), for the padding
    that gives every rank the same number of rows to gather.
    """
    sp, batch = dims.sp_size, latents.shape[0]
    if sp == 1:
        return decode(latents)
    rows = -(-batch // sp)  # samples per rank, the last ranks padded
    mine = latents[dims.sp_rank::sp]
    local = torch.zeros(rows, *video_shape, dtype=torch.float32)
    if len(mine):
        local[:len(mine)] = decode(mine).float()
    gathered = all_gather_in_group(local.to(dims.device), dims.sp_group).cpu()  # (sp * rows, ...) in rank order
    if not dims.is_sp_leader:
        return None
    order = torch.empty(batch, dtype=torch.long)  # sample i = rank i % sp, its row i // sp
    for i in range(batch):
        order[i] = (i % sp) * rows + i // sp
    return gathered[order]


def share_rewards(rewards: Optional[Dict[str, torch.Tensor]], dims: ParallelDims) -> Dict[str, torch.Tensor]:
    """The SP leader's reward dict ({name: (B,) CPU tensor}) on every rank of its SP group."""
    rewards = broadcast_object_from_sp_leader(rewards, dims)
    if rewards is None:
        raise RuntimeError("the SP leader produced no rewards")
    return rewards


def _gather(rewards: Dict[str, torch.Tensor], group, dims: ParallelDims) -> Dict[str, torch.Tensor]:
    # Sorted names: the collectives run in the same order on every rank.
    return {name: all_gather_in_group(rewards[name].to(dims.device), group).cpu() for name in sorted(rewards)}


def gather_group_rewards(rewards: Dict[str, torch.Tensor], dims: ParallelDims,
                         ranks_per_group: int) -> Dict[str, torch.Tensor]:
    """This rank's prompt group: the local (B,) rewards, or the whole (G,) group when it spans several DP ranks."""
    if ranks_per_group == 1:
        return rewards
    return _gather(rewards, dims.prompt_group, dims)


def gather_step_rewards(rewards: Dict[str, torch.Tensor], dims: ParallelDims) -> Dict[str, torch.Tensor]:
    """All ``B x dp`` rewards of the step, in DP-rank order (so prompt groups stay contiguous), on every rank."""
    return _gather(rewards, dims.dp_group, dims)

"""Several optimizer passes over one rollout batch (``--num_inner_epochs K``; Flow-GRPO's inner epochs).

The reference feeds every rollout batch to exactly one optimizer update, so the policy never moves between the
rollout and its re-scoring: the importance ratio is exactly 1, the PPO clip never acts and the step-wise KL
mean(log pi_old - log pi_theta) is 0 in value. With K > 1 passes, pass k > 0 re-scores the same stored transitions
with the weights the earlier passes' updates produced, so the ratio, the clip and the step-wise KL do act.

Randomness, decided once: every pass draws its own sample shuffle and per-sample step order from a generator seeded
by (seed, dp rank, global step, 7) for pass 0 (exactly the seed the single-pass trainer always used, so K = 1 is the
reference run bit for bit) and (seed, dp rank, global step, 7, pass) for the later passes. Being derived from the
counters the checkpoint already holds, the passes' shuffles need no generator state of their own in the checkpoint:
a resume (always between outer steps) redraws exactly the shuffles the uninterrupted run draws.

Metrics: with K = 1 nothing changes (the same keys). With K > 1 the step's top-level metrics are the mean over the
passes (``KL_weight``: its last value; the others were already means over the pass's backwards) and every pass's own
metrics are logged under ``inner_epoch_{k}/`` (k from 0), e.g. ``inner_epoch_1/ratio_mean``.
"""
from typing import Callable, Dict, List, Tuple

import torch

LAST_VALUE_METRICS = ("KL_weight",)  # a controller's state, not an average


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (Python hashes tuples of ints deterministically across processes)."""
    return hash(tuple(int(p) for p in parts)) & 0x7FFF_FFFF_FFFF_FFFF


def pass_seed(seed: int, dp_rank: int, global_step: int, pass_index: int) -> int:
    """The seed of pass ``pass_index``'s shuffles; pass 0 keeps the single-pass trainer's seed."""
    parts = (seed, dp_rank, global_step, 7) + ((pass_index,) if pass_index > 0 else ())
    return derived_seed(*parts)


def shuffled_pairs(seed: int, batch: int, trained_steps: torch.Tensor, permute: bool) -> Tuple[torch.Tensor, ...]:
    """(shuffle (B,), order (B, S)): the order in which a pass visits the samples, and each sample's order over the
    S ``trained_steps`` (original step indices; all N steps, or a window of them).

    ``permute`` false keeps ``trained_steps`` in order for every sample. With ``trained_steps = arange(N)`` the draws
    equal ``randperm(N)`` per sample, so the full-schedule order is the reference's.
    """
    generator = torch.Generator().manual_seed(seed)
    shuffle = torch.randperm(batch, generator=generator)
    count = trained_steps.numel()
    if permute:
        order = torch.stack([trained_steps[torch.randperm(count, generator=generator)] for _ in range(batch)])
    else:  # the reference crashes here with the equalizer on (docs/reference.md#d8); a (B, S) fixed order works
        order = trained_steps.repeat(batch, 1)
    return shuffle, order


def run_inner_epochs(num_epochs: int, one_pass: Callable[[int], Dict[str, float]]) -> Dict[str, float]:
    """Run ``one_pass(k)`` for k = 0..K-1 and merge their metrics (see the module docstring)."""
    if num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
    passes: List[Dict[str, float]] = [one_pass(k) for k in range(num_epochs)]
    if num_epochs == 1:
        return passes[0]
    return merge_pass_metrics(passes)


def merge_pass_metrics(passes: List[Dict[str, float]]) -> Dict[str, float]:
    """Top-level means over the passes (last value for ``LAST_VALUE_METRICS``) plus ``inner_epoch_{k}/`` copies."""
    merged: Dict[str, float] = {}
    names = sorted({name for metrics in passes for name in metrics})
    for name in names:
        values = [metrics[name] for metrics in passes if name in metrics]
        merged[name] = values[-1] if name in LAST_VALUE_METRICS else sum(values) / len(values)
    for index, metrics in enumerate(passes):
        merged.update({f"inner_epoch_{index}/{name}": value for name, value in metrics.items()})
    return merged

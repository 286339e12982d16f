"""The auto decisions that spend free GPU memory on speed, taken by :func:`sage_grpo.plan.memory.plan_launch` once the
placements (where the reference lives, when gradients are reduced) are fixed, in this order:

1. ``--async_reward auto``: the reward scored in a background worker while the reference means run
   (``sage_grpo.trainer``). A remote reward (``--remote_reward_url``) costs this GPU nothing: on. A local one holds its
   forward (VideoAlign on the SP leaders) beside the reference pass: on when that does not raise the step's peak or
   the plan still fits with ``MARGIN`` of the GPU free.
2. ``--replay_group_size 0``: the largest number of a sample's trained steps per policy forward and backward
   (``sage_grpo.pipeline.policy_update``) whose plan fits with ``MARGIN`` free (the train phase's activations grow
   with the rows of a forward); 1 (the reference) with ``--lora_dropout > 0``, where one forward of g rows draws other
   dropout masks than g forwards and the numbers would change beyond float order.
3. ``--reference_batch_size 0``: the largest reference batch (transitions per no-grad reference forward, doubling from
   ``--mini_batch_size_per_update`` up to a rollout batch's transitions) that does not raise the step's peak (memory
   the step holds anyway; the no-grad forward's bytes are an estimate, so the GPU is not filled beyond that).

Off CUDA there is no GPU budget (``memory.resolve_placement``, :func:`off_cuda`): the remote reward is still scored in
the background, a local one is not (the CPU's cores are the trainer's threads), and the replay group and the reference
batch keep the reference's arithmetic (1 step per forward; ``--mini_batch_size_per_update`` transitions), which another
batch changes in the last bits while the CPU runs are pinned bit for bit.

The flags' share of the decisions is read once from the run's sections (:class:`ThroughputFlags`).
"""

import dataclasses
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from sage_grpo.config.train import LoRAConfig, RewardConfig, ThroughputConfig
from sage_grpo.config.validation import trained_steps_per_sample
from sage_grpo.models.placement import Placement
from sage_grpo.plan.options import PlanOptions


def reference_batch_candidates(cfg: PlanOptions) -> List[int]:
    """Reference batch sizes ``--reference_batch_size 0`` tries on CUDA: ``--mini_batch_size_per_update`` doubled up
    to a rollout batch's transitions with reference means (B x the steps trained: the window's, or all N)."""
    transitions = cfg.data.batch_size * (cfg.rollout.sde_window_size or cfg.rollout.grpo_sampling_steps)
    sizes, size = [], cfg.parallel.mini_batch_size_per_update
    while size < transitions:
        sizes.append(size)
        size *= 2
    return sizes + [transitions]


def fixed_async_reward(throughput: ThroughputConfig, reward: RewardConfig) -> Optional[bool]:
    """``--async_reward`` where no plan is needed: True or False when given, True for a remote reward, else None."""
    if throughput.async_reward != "auto":
        return throughput.async_reward == "true"
    return True if reward.remote_reward_url else None


def fixed_replay_group(throughput: ThroughputConfig, lora: LoRAConfig) -> Optional[int]:
    """``--replay_group_size`` where no plan is needed: the value given, 1 with LoRA dropout, else None."""
    if throughput.replay_group_size:
        return throughput.replay_group_size
    return 1 if lora.use_lora and lora.lora_dropout > 0 else None


@dataclass(frozen=True)
class ThroughputFlags:
    """What the flags leave to the three decisions: a value where given (or implied), None or 0 where the plan
    decides, and the bounds of its searches."""

    async_reward: Optional[bool]  # fixed_async_reward
    replay_group: Optional[int]  # fixed_replay_group
    reference_batch: int  # --reference_batch_size; 0: the plan's
    mini_batch: int  # --mini_batch_size_per_update: the reference's batch off CUDA, and the fallback
    trained_steps: int  # a sample's trained steps: the largest replay group
    candidates: Tuple[int, ...]  # reference_batch_candidates

    @classmethod
    def of(cls, cfg: PlanOptions) -> "ThroughputFlags":
        return cls(fixed_async_reward(cfg.throughput, cfg.reward), fixed_replay_group(cfg.throughput, cfg.lora),
                   cfg.parallel.reference_batch_size, cfg.parallel.mini_batch_size_per_update,
                   trained_steps_per_sample(cfg), tuple(reference_batch_candidates(cfg)))


def choose_throughput(flags: ThroughputFlags, placement: Placement, plan: Callable, margin: float) -> Placement:
    """``placement`` (its placements decided) with the three decisions of the module docstring; ``plan`` maps a
    placement to its :class:`~sage_grpo.plan.memory.MemoryPlan`."""
    async_reward = flags.async_reward
    if async_reward is None:
        scored_beside = plan(dataclasses.replace(placement, async_reward=True))
        async_reward = scored_beside.fits(margin) or scored_beside.peak.bytes <= plan(placement).peak.bytes
    placement = dataclasses.replace(placement, async_reward=async_reward)
    group = flags.replay_group
    if group is None:  # the train phase grows with the group: the first that does not fit ends the search
        group = 1
        while group < flags.trained_steps and plan(dataclasses.replace(
                placement, replay_group_size=group + 1)).fits(margin):
            group += 1
    placement = dataclasses.replace(placement, replay_group_size=group)
    if flags.reference_batch:
        return dataclasses.replace(placement, reference_batch_size=flags.reference_batch)
    peak = plan(placement).peak.bytes
    fitting = [size for size in flags.candidates
               if plan(dataclasses.replace(placement, reference_batch_size=size)).peak.bytes <= peak]
    return dataclasses.replace(placement, reference_batch_size=max(fitting, default=flags.mini_batch))


def off_cuda(flags: ThroughputFlags, placement: Placement) -> Placement:
    """``placement`` on a device without a GPU budget: the given values, else the reference's arithmetic."""
    return dataclasses.replace(placement, reference_batch_size=flags.reference_batch or flags.mini_batch,
                               replay_group_size=flags.replay_group or 1, async_reward=bool(flags.async_reward))

"""The GRPO math as pure functions and small resumable state: advantages, PPO loss, KL terms and control."""
from sage_grpo.rl.advantages import (REWARD_AGGREGATIONS, RewardAggregation, clip_advantages, group_advantages,
                                     local_advantages, reward_statistics, zero_spread_fraction)
from sage_grpo.rl.anchor import AnchorMeans, MovingAnchorSchedule
from sage_grpo.rl.drift_guard import DriftGuard, DriftWatch, drift_watch_of
from sage_grpo.rl.kl import (KL_MODES, NO_KL, KLMode, dual_kl, kl_mode, kl_mode_of, mean_matching_kl, resolve_kl_mode,
                             stepwise_kl)
from sage_grpo.rl.grad_balance import window_scales
from sage_grpo.rl.kl_controller import AdaptiveKLController
from sage_grpo.rl.ppo import ppo_clipped_loss

__all__ = [
    "KL_MODES",
    "REWARD_AGGREGATIONS",
    "NO_KL",
    "AdaptiveKLController",
    "AnchorMeans",
    "DriftGuard",
    "DriftWatch",
    "KLMode",
    "MovingAnchorSchedule",
    "RewardAggregation",
    "clip_advantages",
    "drift_watch_of",
    "dual_kl",
    "group_advantages",
    "kl_mode",
    "kl_mode_of",
    "local_advantages",
    "mean_matching_kl",
    "ppo_clipped_loss",
    "resolve_kl_mode",
    "reward_statistics",
    "stepwise_kl",
    "window_scales",
    "zero_spread_fraction",
]

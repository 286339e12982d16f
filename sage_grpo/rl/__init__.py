"""The GRPO math as pure functions and small resumable state: advantages, PPO loss, KL terms and control.

The names below are imported when first used (PEP 562): the configuration reads the KL-controller table's names
(``rl.kl_controllers``) without importing torch.
"""

from sage_grpo import lazy_exports

_EXPORTS = {
    "REWARD_AGGREGATIONS": "advantages",
    "RewardAggregation": "advantages",
    "clip_advantages": "advantages",
    "group_advantages": "advantages",
    "local_advantages": "advantages",
    "reward_statistics": "advantages",
    "zero_spread_fraction": "advantages",
    "AnchorMeans": "anchor",
    "MovingAnchorSchedule": "anchor",
    "DriftGuard": "drift_guard",
    "DriftWatch": "drift_guard",
    "drift_watch_of": "drift_guard",
    "KL_MODES": "kl",
    "NO_KL": "kl",
    "KLMode": "kl",
    "dual_kl": "kl",
    "kl_mode": "kl",
    "kl_mode_of": "kl",
    "mean_matching_kl": "kl",
    "resolve_kl_mode": "kl",
    "stepwise_kl": "kl",
    "window_scales": "grad_balance",
    "AdaptiveKLController": "kl_controller",
    "KL_CONTROLLERS": "kl_controllers",
    "KLController": "kl_controllers",
    "build_kl_controller": "kl_controllers",
    "ppo_clipped_loss": "ppo",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

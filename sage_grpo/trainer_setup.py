"""What the trainer checks and builds besides its models (those are :mod:`sage_grpo.models.bundle`): the reward
configuration, checked before any model loads, and the reward callable.
"""

from typing import Callable, Dict, Optional

import torch

from sage_grpo.config import TrainConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.dtypes import DTYPES


class RewardFailure(RuntimeError):
    """The reward failed on every sample of too many consecutive steps (``--max_failed_reward_steps``)."""


def check_reward_config(cfg: TrainConfig, reward_weights: Optional[Dict[str, float]]) -> None:
    """Validate the reward configuration and resolve its names (plug-ins imported under the plug-in rule of
    :mod:`sage_grpo.rewards.registry`) without building any reward model. ``reward_weights``: ``--reward_weights``
    parsed by :func:`sage_grpo.rewards.parse_reward_weights`."""
    from sage_grpo.rewards import plan_reward_models

    try:
        plan_reward_models(cfg.reward_model, reward_weights, cfg.reward_kwargs, batch_size=cfg.reward_batch_size)
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"--reward_model {cfg.reward_model}: {err}") from None


def build_reward(cfg: TrainConfig, reward_weights: Optional[Dict[str, float]], device: torch.device) -> Callable:
    from sage_grpo.rewards import build_reward_fn

    return build_reward_fn(cfg.reward_model, reward_weights,
                           model_root=cfg.pretrained_model_root, checkpoint_mode=cfg.reward_checkpoint_mode,
                           device=device, dtype=DTYPES[cfg.dtype], video_fps=cfg.video_fps,
                           batch_size=cfg.reward_batch_size, reward_kwargs=cfg.reward_kwargs,
                           score_from_mp4=cfg.reward_from_mp4)

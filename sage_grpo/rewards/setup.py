"""What the trainer checks and builds besides its models (those are :mod:`sage_grpo.models.bundle`): the reward
configuration, parsed and checked once before any model loads (:class:`RewardPlan`), and the reward callable.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from sage_grpo.config import TrainConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.dtypes import DTYPES
from sage_grpo.config.reward_weights import parse_reward_weights
from sage_grpo.rewards import avg_term_weights, build_reward_fn, plan_reward_models
from sage_grpo.rewards.registry import RewardContext
from sage_grpo.rewards.remote import RemoteSettings
from sage_grpo.rewards.videoalign_inputs import SamplingOverrides
from sage_grpo.rl import RewardAggregation


class RewardFailure(RuntimeError):
    """The reward failed on every sample of too many consecutive steps (``--max_failed_reward_steps``)."""


@dataclass(frozen=True)
class RewardPlan:
    """The reward flags as typed values: everything downstream takes these, never the raw flags."""

    weights: Optional[Dict[str, float]]  # --reward_weights parsed (None: the model's default weights)
    sampling: SamplingOverrides  # --videoalign_fps / --videoalign_num_frames / --videoalign_max_pixels
    remote: Optional[RemoteSettings]  # --remote_reward_url and its retries and timeout; None: score locally
    aggregation: RewardAggregation  # --reward_aggregation with the weight of every term of avg


def check_reward_config(cfg: TrainConfig) -> RewardPlan:
    """Parse and validate the reward configuration and resolve its names (plug-ins imported under the plug-in rule
    of :mod:`sage_grpo.rewards.registry`) without building any reward model."""
    try:
        weights = parse_reward_weights(cfg.reward_weights)
        models = plan_reward_models(cfg.reward_model, weights, cfg.reward_kwargs, batch_size=cfg.reward_batch_size)
        aggregation = RewardAggregation(cfg.reward_aggregation, avg_term_weights(models)
                                        if cfg.reward_aggregation == "advantage" else None)
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"--reward_model {cfg.reward_model}: {err}") from None
    try:
        sampling = SamplingOverrides(cfg.videoalign_fps, cfg.videoalign_num_frames, cfg.videoalign_max_pixels)
        remote = (RemoteSettings(cfg.remote_reward_url, cfg.remote_reward_retries, cfg.remote_reward_timeout)
                  if cfg.remote_reward_url else None)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return RewardPlan(weights, sampling, remote, aggregation)


def build_reward(cfg: TrainConfig, plan: RewardPlan, device: torch.device) -> Callable:
    context = RewardContext(cfg.pretrained_model_root, cfg.reward_checkpoint_mode, device, DTYPES[cfg.dtype],
                            cfg.video_fps, cfg.reward_from_mp4, plan.sampling)
    return build_reward_fn(cfg.reward_model, plan.weights, context=context, batch_size=cfg.reward_batch_size,
                           reward_kwargs=cfg.reward_kwargs, remote=plan.remote)

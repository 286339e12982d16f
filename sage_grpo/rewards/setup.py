"""What the trainer checks and builds besides its models (those are :mod:`sage_grpo.models.bundle`): the reward
configuration, parsed and checked once before any model loads (:class:`RewardPlan`), the reward callable, and the
held-out metrics of the scored validation (``--validation_metrics``: :mod:`sage_grpo.rewards.scorers`).
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol

import torch

from sage_grpo.config.train.model import ModelConfig
from sage_grpo.config.train.rollout import RewardConfig, RolloutConfig
from sage_grpo.config.train.run import ValidationConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.dtypes import DTYPES
from sage_grpo.config.reward_weights import parse_reward_weights
from sage_grpo.rewards import avg_term_weights, build_reward_fn, plan_reward_models
from sage_grpo.rewards.builtins import RewardContext
from sage_grpo.rewards.registry import check_reward_files
from sage_grpo.rewards.scorers import MetricPlan, Scorers, held_out, plan_metrics
from sage_grpo.rewards.remote import RemoteSettings
from sage_grpo.rewards.videoalign_inputs import SamplingOverrides
from sage_grpo.rl import RewardAggregation


class RewardOptions(Protocol):
    """The sections of the training configuration the reward is planned and built from (declared by shape): the
    reward flags, the held-out metrics of validation, the model root and dtype, the videos' frame rate."""

    model: ModelConfig
    rollout: RolloutConfig
    reward: RewardConfig
    validation: ValidationConfig


class RewardFailure(RuntimeError):
    """The reward failed on every sample of too many consecutive steps (``--max_failed_reward_steps``)."""


@dataclass(frozen=True)
class RewardPlan:
    """The reward flags as typed values: everything downstream takes these, never the raw flags."""

    weights: Optional[Dict[str, float]]  # --reward_weights parsed (None: the model's default weights)
    sampling: SamplingOverrides  # --videoalign_fps / --videoalign_num_frames / --videoalign_max_pixels
    remote: Optional[RemoteSettings]  # --remote_reward_url and its retries and timeout; None: score locally
    aggregation: RewardAggregation  # --reward_aggregation with the weight of every term of avg
    models: Dict[str, dict]  # every reward model of avg (--reward_model, --extra_rewards): {name: entry}
    held_out: Optional[MetricPlan] = None  # --validation_metrics not trained on; None: the training reward alone
    notes: tuple = ()


def check_reward_config(cfg: RewardOptions) -> RewardPlan:
    """Parse and validate the reward configuration and resolve its names (plug-ins imported under the plug-in rule
    of :mod:`sage_grpo.rewards.registry`) without building any reward model; the scorers' folders are found."""
    try:
        weights = parse_reward_weights(cfg.reward.reward_weights)
        models = plan_reward_models(cfg.reward.reward_model, weights, cfg.reward.reward_kwargs, cfg.reward.extra_rewards,
                                    batch_size=cfg.reward.reward_batch_size)
        aggregation = RewardAggregation(cfg.reward.reward_aggregation, avg_term_weights(models)
                                        if cfg.reward.reward_aggregation == "advantage" else None)
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"--reward_model {cfg.reward.reward_model}: {err}") from None
    try:
        sampling = SamplingOverrides(cfg.reward.videoalign_fps, cfg.reward.videoalign_num_frames, cfg.reward.videoalign_max_pixels)
        remote = (RemoteSettings(cfg.reward.remote_reward_url, cfg.reward.remote_reward_retries, cfg.reward.remote_reward_timeout)
                  if cfg.reward.remote_reward_url else None)
        context = reward_context(cfg, sampling, "cpu")
        check_reward_files({m: e for m, e in models.items() if remote is None or m != next(iter(models))}, context)
        held_out, notes = _held_out_metrics(cfg, models)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    return RewardPlan(weights, sampling, remote, aggregation, models, held_out, tuple(notes))


def _held_out_metrics(cfg: RewardOptions, trained: Dict[str, dict]):
    """``--validation_metrics`` planned (names checked, folders found), without those the training reward scores
    already (its sub-rewards are logged anyway); None when no validation runs or none is left."""
    kept, dropped = held_out(cfg.validation.validation_metrics or [], trained)
    notes: List[str] = [f"--validation_metrics {name}: the training reward scores the validation videos already "
                        "(Validation/<its keys>)" for name in dropped]
    if kept and not (cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0):
        notes.append("--validation_metrics is set but no validation runs (--validation_interval 0, "
                     "--validate_at_step0 false)")
        return None, notes
    plan = plan_metrics(kept, model_root=cfg.model.pretrained_model_root, clip_model=cfg.reward.clip_model,
                        pickscore_model=cfg.reward.pickscore_model, pickscore_processor=cfg.reward.pickscore_processor,
                        flag="--validation_metrics") if kept else None
    return plan, notes


def reward_context(cfg: RewardOptions, sampling: SamplingOverrides, device) -> RewardContext:
    return RewardContext(cfg.model.pretrained_model_root, cfg.reward.reward_checkpoint_mode, device, DTYPES[cfg.model.dtype],
                         cfg.rollout.video_fps, cfg.reward.reward_from_mp4, sampling, cfg.reward.clip_model, cfg.reward.pickscore_model,
                         cfg.reward.pickscore_processor)


def build_reward(cfg: RewardOptions, plan: RewardPlan, device: torch.device) -> Callable:
    return build_reward_fn(cfg.reward.reward_model, plan.weights, context=reward_context(cfg, plan.sampling, device),
                           batch_size=cfg.reward.reward_batch_size, reward_kwargs=cfg.reward.reward_kwargs,
                           extra_models=cfg.reward.extra_rewards, remote=plan.remote)


def build_held_out_scorers(cfg: RewardOptions, plan: RewardPlan, device: torch.device) -> Optional[Scorers]:
    """The held-out metrics' scorers (main process only), or None."""
    if plan.held_out is None:
        return None
    return Scorers(plan.held_out, cfg.model.pretrained_model_root, device, DTYPES[cfg.model.dtype])

"""The trainer's parts, built from a resolved start (:class:`~sage_grpo.startup.resolve.Startup`) once every check
has passed: the models (seeded alike on every rank, then laid out by the parallel plan), the reward and the held-out
scorers, the optimizer and its EMA, the KL controller, the moving anchor's schedule, the step's reward worker and the
policy pass. Each part gets the configuration sections and plan entries it uses.

The order is the run's: every rank builds the models under ``--seed`` (identical replicas, e.g. a random LoRA init),
then the global RNGs are seeded ``seed + dp_rank`` as in the reference, then the rest.
"""

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

import torch

from sage_grpo import rl
from sage_grpo.checkpoint import CheckpointManager, seed_everything
from sage_grpo.config.schema import config_to_yaml
from sage_grpo.config.train.objective import TrustRegionConfig
from sage_grpo.distributed.parallelize import parallelize_models, policy_param_dtype
from sage_grpo.models.bundle import ModelBundle, build_models
from sage_grpo.optim.ema import PolicyEMA
from sage_grpo.optim.optimizers import build_optimizer
from sage_grpo.data import PromptItem
from sage_grpo.pipeline.policy_update import PolicyPass
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.pipeline.validation import ValidationSettings, Validator, VideoScoreMetric, per_video
from sage_grpo.resume import layout_record
from sage_grpo.rewards.scorers import Scorers
from sage_grpo.rewards.setup import build_held_out_scorers, build_reward
from sage_grpo.rewards.step_rewards import StepRewards
from sage_grpo.startup.checks import validation_sampler_of
from sage_grpo.startup.resolve import Startup
from sage_grpo.tracking.run_dir import show_progress_bars


@dataclass
class TrainingParts:
    """What the trainer trains with (module docstring)."""

    models: ModelBundle
    reward_fn: Optional[Callable]  # on SP leaders only
    held_out: Optional[Scorers]  # --validation_metrics, on the main process only
    optimizer: Any
    ema: Optional[PolicyEMA]  # --ema_decay > 0
    kl_controller: Optional[rl.KLController]  # None without a KL reference
    anchor: rl.MovingAnchorSchedule
    rewards: StepRewards
    reference_sampler: Sampler  # the rollout's sampler at --reference_batch_size transitions per forward
    policy_pass: PolicyPass


def kl_controller_of(trust_region: TrustRegionConfig, kl_mode: rl.KLMode,
                     device: torch.device) -> Optional[rl.KLController]:
    """The run's KL controller (``--kl_controller``, from the trust-region section); None without a KL reference.
    β lives on the device from the start (a 0-d fp64 tensor): decided here, never re-tested per backward."""
    if not kl_mode.uses_reference:
        return None
    return rl.build_kl_controller(trust_region.kl_controller, trust_region, device)


def build_models_of(start: Startup) -> ModelBundle:
    """The models on every rank under ``--seed``, laid out by the parallel plan (SP, then FSDP2), then the global
    RNGs seeded ``seed + dp_rank``."""
    cfg, plan, dims = start.cfg, start.plan, start.dims
    dims.build_meshes()
    seed_everything(cfg.data.seed)  # identical replicas: every rank builds the models under the same seed
    models = build_models(cfg, plan.kl_mode, plan.placement)
    parallelize_models(models, dims, cfg.parallel, policy_param_dtype(cfg))
    seed_everything(cfg.data.seed + dims.dp_rank)
    return models


def build_parts(start: Startup) -> TrainingParts:
    """Every part of :class:`TrainingParts`, in the run's order (module docstring)."""
    cfg, plan, dims = start.cfg, start.plan, start.dims
    models = build_models_of(start)
    device = models.device
    reward_fn = build_reward(cfg, plan.reward, device) if dims.is_sp_leader else None
    # the held-out validation metrics load on the main process only, and only when asked (--validation_metrics)
    held_out = build_held_out_scorers(cfg, plan.reward, device) if dims.is_main else None
    optimizer = build_optimizer(models.trainable_named_parameters(), use_muon=cfg.optim.use_muon,
                                lr=cfg.optim.learning_rate, weight_decay=cfg.optim.weight_decay)
    ema = PolicyEMA(models.trainable_state_dict(), cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None
    kl_controller = kl_controller_of(cfg.trust_region, plan.kl_mode, device)
    anchor = rl.MovingAnchorSchedule(plan.kl_mode.moving_anchor, cfg.trust_region.update_ref_model_step)
    rewards = StepRewards(reward_fn, dims, plan.layout.ranks_per_group, device, plan.placement.async_reward)
    return TrainingParts(models, reward_fn, held_out, optimizer, ema, kl_controller, anchor, rewards,
                         start.sampler.with_micro_batch(plan.placement.reference_batch_size),
                         policy_pass_of(start, models, kl_controller))


def policy_pass_of(start: Startup, models: ModelBundle, kl_controller: Optional[rl.KLController]) -> PolicyPass:
    """The policy pass: the update and trust-region sections, the micro-batch and accumulation, the sampler, the KL
    mode and controller, the equalizer's scales (``--use_grad_balancing``; renormalised over the SDE window with
    ``--sde_window_equalizer window``) and the trained steps per sample."""
    cfg, plan = start.cfg, start.plan
    eq_scales = start.sampler.grad_balance_scales() if cfg.update.use_grad_balancing else None
    window_equalizer = cfg.update.sde_window_equalizer == "window" and plan.schedule.window.enabled
    show_bar = show_progress_bars(start.dims.is_main, cfg.output.quiet)  # main process, terminal, no --quiet
    return PolicyPass(cfg.update, cfg.trust_region, cfg.parallel.mini_batch_size_per_update,
                      cfg.optim.gradient_accumulation_steps, start.sampler, models, plan.kl_mode, kl_controller,
                      eq_scales, plan.schedule.trained_steps_per_sample, show_bar, window_equalizer)


def validator_of(start: Startup, parts: TrainingParts, i2v_size: Callable[[PromptItem], Tuple[int, int]],
                 encode: Callable, log_videos: Callable) -> Validator:
    """The validation step (:mod:`sage_grpo.pipeline.validation`): sampling at the validation size (an
    image-to-video item at ``i2v_size``), then the training reward and its sub-rewards on the videos (where the
    reward lives, on the main process), then the held-out metrics."""
    size = start.plan.schedule.validation
    settings = ValidationSettings(tuple(start.validation_items), size.frames, start.cfg.rollout.video_fps,
                                  lambda item: i2v_size(item) if item.task == "i2v" else (size.height, size.width))
    sampler = start.validation_sampler or validation_sampler_of(start.cfg, start.sampler)
    validator = Validator(settings, sampler, parts.models, is_main=start.dims.is_main, encode=encode,
                          log_videos=log_videos)
    if parts.reward_fn is not None:
        validator.add_metric(VideoScoreMetric("reward", per_video(parts.reward_fn)))
    if parts.held_out is not None:
        validator.add_metric(VideoScoreMetric("held_out", parts.held_out))
    return validator


def checkpoints_of(start: Startup, parts: TrainingParts, counters: Any, run_dir: Path,
                   log: Callable[[str], None]) -> CheckpointManager:
    """The checkpoint manager of what the trainer owns (``counters``: the trainer, for its counters), recording the
    run's layout (the parallel layout, the model root's fingerprint, the prompts) and its configuration."""
    layout = start.plan.layout
    record = layout_record(start.cfg.model, layout.world_size, layout.dp_size, layout.sp_size,
                           layout.videos_per_step, start.items)
    return CheckpointManager(models=parts.models, optimizer=parts.optimizer, kl_controller=parts.kl_controller,
                             anchor_schedule=parts.anchor, counters=counters, dims=start.dims, run_dir=run_dir,
                             keep_checkpoints=start.cfg.output.keep_checkpoints, layout=record,
                             config_yaml=partial(config_to_yaml, start.cfg), log=log, ema=parts.ema)

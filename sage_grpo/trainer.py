"""The SAGE-GRPO trainer (reference_spec §2): one outer step is

    rollout  ->  reward (started)  ->  reference means  ->  reward (collected)  ->  group advantages  ->  policy update
    ->  (anchor refresh)

* Rollout: every prompt of this rank's batch is sampled with the SDE sampler (``Sampler``, built once) at all
  ``grpo_sampling_steps`` steps, storing the latents x_0..x_N and the per-step log-probs log pi_old(x_{k+1} | x_k).
* Reward: the reward stack scores the decoded videos; ``avg`` is the GRPO reward. Failed rewards are NaN. The
  reference means do not need the rewards: with ``--async_reward`` they are scored in a background worker while the
  reference means run (``rewards.step_rewards``), the same numbers, collected before the advantages.
* Advantages: per-group population z-score with a 1e-6 floor (NaN rewards excluded, advantage 0) of ``avg``, or with
  ``--reward_aggregation advantage`` the weighted sum of each reward term's own z-scores (``rl.advantages``).
* Reference means: the KL anchor's SDE means mu_ref on the stored transitions, computed before training (the
  reference's ``rollout_phase`` mode) so the policy pass needs no second model.
* Policy update: samples are shuffled and each sample's steps permuted; every (sample, step) pair gets the PPO clipped
  loss times the equalizer scale of its *original* step, plus beta * (w_m * KL_mean-matching + w_s * KL_step-wise) with
  beta from the adaptive controller. Gradients accumulate into one optimizer update per
  ``--gradient_accumulation_steps`` rollout batches.
* Anchor: after every ``--update_ref_model_step``-th update the reference model is overwritten with the policy (the
  moving anchor; between two inner epochs, the later ones see the new anchor's means: ``rl.AnchorMeans``).

Image-to-video: a step's prompts are one task (``data.py``); an i2v batch's prompt embeddings carry the image
condition of its reference images (``ModelBundle.encode``), so rollout, replay, reference means and validation use it
without knowing the task.

Randomness is derived from (seed, step, sample) so that resuming needs only the counters: the initial noise of a
sample uses its CSV-derived seed (reference), its SDE noise a generator seeded from (seed, global step, the sample's
index in the step's global batch), and the shuffles a generator seeded from (seed, dp rank, global step).

Checkpoints: a :class:`~sage_grpo.checkpoint.CheckpointManager`, built once with what the trainer owns (the model
bundle, the optimizer, the KL controller, the anchor schedule, the EMA of ``--ema_decay``, and the trainer itself for
its counters through ``state_dict``/``load_state_dict``), saves and restores all of it; the loop only says when.

Several processes (``torchrun``; reference_spec §3). ``world = dp x sp`` with contiguous SP groups
(``ParallelDims``); the layout rules are checked before any model loads. The policy and the reference get Ulysses SP
and FSDP2 from :func:`~sage_grpo.distributed.parallelize.parallelize_models`; the optimizer is built afterwards.

* Data: the sampler deals prompt groups over the DP ranks; a group spans ``G / B`` DP ranks when ``B < G``. Every rank
  of an SP group derives its prompts, seeds, SDE noise and permutations from its ``dp_rank`` and so sees the same
  samples (asserted each step); the stored rollout is broadcast from the SP leader.
* Rewards: the final latents are decoded (VAE) and scored once per SP group, on its leader, and broadcast; a group
  spread over DP ranks is gathered so its advantages are normalized over the whole group, each rank keeping its
  slice. Reward statistics are over all ``B x dp`` samples of the step; loss, KL and timing metrics are averaged over
  the world.
* Gradients: FSDP reduces (mean over every rank: DP mean and SP correction) only on the last backward of an
  accumulation window (``gradient_sync``): one reduce-scatter per optimizer update instead of the reference's one per
  backward (spec §10.20), at the price of holding the unsharded fp32 gradients between backwards. Without FSDP the
  gradients are averaged once per update.
* KL controller: fed the world-mean KL of each inner iteration, so every rank has the same beta (the reference keeps
  unsynchronized per-rank controllers, spec §10.12) and rank 0's checkpoint describes every rank.
* Files: the run directory, console, metrics, TensorBoard and validation videos are written by rank 0; rollout media
  by each SP leader (names carry the dp rank and the global rank); checkpoints by every rank together (DCP shards,
  ``CheckpointManager.save``). Every collective, the end-of-training checkpoint included, is entered by every rank
  (the reference's rank-0-only final save deadlocks, spec §10.5).
* Seeds: the models are built under ``--seed`` on every rank (identical replicas, e.g. a random LoRA init), then the
  global RNGs are seeded ``seed + dp_rank`` as in the reference.
"""

import time
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

from sage_grpo import rl
from sage_grpo.checkpoint import CheckpointManager, list_checkpoints, resumes, seed_everything
from sage_grpo.config import TrainConfig, save_yaml
from sage_grpo.config.schema import config_to_yaml, to_dict
from sage_grpo.config.validation import (ConfigError, group_layout, parse_size, rollout_size, trained_steps_per_sample,
                                        validation_flow_shift, validation_size)
from sage_grpo.data import GroupedPromptSampler, PromptItem, check_tasks, read_prompt_csvs, sample_seeds, video_size
from sage_grpo.distributed import barrier, destroy_distributed, mean_over_world
from sage_grpo.distributed.liveness import PeerLost
from sage_grpo.distributed.startup import start_processes
from sage_grpo.distributed.parallelize import (average_unsharded_gradients, clip_gradients, clip_threshold,
                                               parallelize_models)
from sage_grpo.distributed.rollout_sync import (check_same_in_sp_group, decode_across_sp_group, gather_step_rewards,
                                                run_on_main, share_rollout)
from sage_grpo.faults import fault_point
from sage_grpo.models.geometry import check_video_sizes, video_tokens_at
from sage_grpo.models.layout import MissingCheckpointError, check_model_root
from sage_grpo.models.variants import resolve_train_sampling
from sage_grpo.optim.ema import PolicyEMA
from sage_grpo.optim.optimizers import LRSchedule, build_optimizer
from sage_grpo.pipeline.failed_steps import count_failed_step, finite_update, step_failures
from sage_grpo.pipeline.drift import DriftGuardStop, DriftSentinel, check_watched_metrics
from sage_grpo.pipeline.policy_update import PolicyPass
from sage_grpo.pipeline.rollout_media import RolloutMedia, RolloutSamples
from sage_grpo.rl.inner_epochs import derived_seed, pass_seed, run_inner_epochs, shuffled_pairs
from sage_grpo.rl.sde_window import SDEWindow
from sage_grpo.resume import (CONFIG_CHANGES_FILE, check_resume, describe_setting, layout_record,
                              record_config_changes, restarts, run_inputs)
from sage_grpo.safe_io import CheckpointError, DiskFullError
from sage_grpo.tracking.trackers import VALIDATION_VIDEOS, check_report_to, start_trackers
from sage_grpo.tracking.run_dir import RUN_MARKER, MetricsLogger, show_progress_bars, startup_summary, truncate_metrics
from sage_grpo.tracking.run_claim import plan_run_dir, release_run_locks
from sage_grpo.dtypes import DTYPES
from sage_grpo.models.attention import check_attention_runs
from sage_grpo.models.bundle import ModelBundle, build_models, resolve_device
from sage_grpo.models.revisions import record_run_weights
from sage_grpo.pipeline.sampler import sampler_of
from sage_grpo.pipeline.validation import (ValidationResult, ValidationSettings, Validator, VideoScoreMetric,
                                           per_video, validation_items)
from sage_grpo.plan.memory import placement_of
from sage_grpo.rewards.remote import RemoteRewardError
from sage_grpo.rewards.setup import RewardFailure, build_held_out_scorers, build_reward, check_reward_config
from sage_grpo.rewards.step_rewards import StepRewards
from sage_grpo.video_io import BackgroundWriter

# Errors a user causes (a flag, a file, a plug-in, a reward that keeps failing): post_train.py prints their message as
# one line instead of a traceback.
USER_ERRORS = (ConfigError, CheckpointError, MissingCheckpointError, FileNotFoundError, RewardFailure,
               RemoteRewardError, PeerLost, DiskFullError, DriftGuardStop)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP parameter (the tensor itself when unsharded)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class GRPOTrainer:
    """Everything a start can check is checked before any model loads (configuration, prompt CSVs, the reward
    configuration and its plug-ins, the resume target and its compatibility, the run directory); the run directory
    is touched (an earlier run deleted under ``--overwrite_output_dir``, ``run_config.yaml`` written) only once the
    models and the reward have loaded, so a failed start leaves an earlier run as it was."""

    def __init__(self, cfg: TrainConfig):
        # the version name, then the variant's guidance and validation shift where no flag sets them (config files)
        cfg, variant_warnings, variant_notes = resolve_train_sampling(cfg)
        self.cfg = cfg
        self.dims, self.peers, self.notes = start_processes(cfg)
        self.notes += variant_notes
        for message in variant_warnings if self.dims.is_main else ():
            warnings.warn(message, UserWarning, stacklevel=2)
        self.dp_rank, self.dp_size, self.is_main = self.dims.dp_rank, self.dims.dp_size, self.dims.is_main
        self.show_bars = show_progress_bars(self.is_main, cfg.output.quiet)  # tqdm bars: main process, terminal, no --quiet
        self.items = read_prompt_csvs(cfg.data.train_video_csv, notes=self.notes)
        self.validation_items = validation_items(cfg)
        check_tasks(self.items + self.validation_items, cfg.model.pretrained_transformer_version,
                    "--pretrained_transformer_version")
        self._check_i2v_tokens()
        self.kl_mode = rl.kl_mode_of(cfg.trust_region)  # decided once: every part below asks this, not the flags
        self.drift_watch = rl.drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, self.kl_mode)  # the drift proxy and guard, likewise
        self.reward_plan = check_reward_config(cfg)  # parsed once: the reward build and the advantages take it
        check_watched_metrics(self.drift_watch, self.reward_plan.held_out)
        self.notes += self.reward_plan.notes
        self.report_to = check_report_to(cfg.output.report_to)  # names; each tracker's package imported here
        check_model_root(Path(cfg.model.pretrained_model_root), cfg.model.pretrained_transformer_version)
        check_video_sizes(cfg)  # sizes and frame counts, which the first rollout would otherwise be the first to see
        # the backend runs on this device in the compute dtype (bf16 autocast, or --dtype), masked and not
        check_attention_runs(cfg.model.attention_backend, resolve_device(cfg),
                             torch.bfloat16 if cfg.model.dtype == "bf16" else DTYPES[cfg.model.dtype])
        self.resume_check = (check_resume(cfg, self.kl_mode, distributed=self.dims.is_distributed, dp_size=self.dp_size,
                                          prompts=self.items)
                             if resumes(cfg.output.resume_from_checkpoint, Path(cfg.output.output_dir)) else None)
        if self.resume_check is not None:
            self.notes += self.resume_check.notes
        self.restart = self.resume_check is None and restarts(cfg)  # auto, before the first checkpoint: from step 0
        self.run_claim = plan_run_dir(cfg, self.dims, self.resume_check, self.restart,
                                      run_inputs(cfg, self.resume_check), self.items + self.validation_items)
        try:  # rollout, replay, reference means and validation all sample through these two
            self.sampler = sampler_of(cfg)
        except ValueError as err:
            raise ConfigError(f"--sde_type {cfg.rollout.sde_type} --eta {cfg.rollout.eta}: {err}") from None
        self.validation_sampler = (self.sampler.with_schedule(cfg.validation.validation_num_inference_steps,
                                                              validation_flow_shift(cfg))
                                   if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0 else None)
        self.prompt_sampler = GroupedPromptSampler(len(self.items), cfg.data.batch_size, cfg.data.num_generations,
                                                   self.dp_size, self.dp_rank, cfg.data.seed,
                                                   tasks=[item.task for item in self.items])
        try:
            self.lr_schedule = LRSchedule(cfg.optim.lr_scheduler, cfg.optim.learning_rate, cfg.optim.warmup_steps,
                                          total_updates=(cfg.optim.max_steps * cfg.update.num_inner_epochs
                                                         // cfg.optim.gradient_accumulation_steps),
                                          num_cycles=cfg.optim.lr_num_cycles, power=cfg.optim.lr_power)
        except ValueError as err:  # e.g. polynomial decay to diffusers' 1e-7 from a smaller learning rate
            raise ConfigError(f"--lr_scheduler {cfg.optim.lr_scheduler}: {err}") from None

        self.dims.build_meshes()
        seed_everything(cfg.data.seed)  # identical replicas: every rank builds the models under the same seed
        self.models: ModelBundle = build_models(cfg, self.kl_mode, placement_of(cfg, resolve_device(cfg)))
        parallelize_models(self.models, self.dims, cfg)
        seed_everything(cfg.data.seed + self.dp_rank)
        self.device = self.models.device
        self.reward_fn = build_reward(cfg, self.reward_plan, self.device) if self.dims.is_sp_leader else None
        # the held-out validation metrics load on the main process only, and only when asked (--validation_metrics)
        self.held_out = build_held_out_scorers(cfg, self.reward_plan, self.device) if self.is_main else None
        self.optimizer = build_optimizer(self.models.trainable_named_parameters(), use_muon=cfg.optim.use_muon,
                                         lr=cfg.optim.learning_rate, weight_decay=cfg.optim.weight_decay)
        self.ema = PolicyEMA(self.models.trainable_state_dict(), cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None
        # β lives on the device from the start (a 0-d fp64 tensor): decided here, never re-tested per backward
        self.kl_controller = (rl.build_kl_controller(cfg.trust_region.kl_controller, cfg.trust_region, self.device)
                              if self.kl_mode.uses_reference else None)
        self.anchor = rl.MovingAnchorSchedule(self.kl_mode.moving_anchor, cfg.trust_region.update_ref_model_step)
        self.ranks_per_group, _ = group_layout(cfg.data.batch_size, cfg.data.num_generations)
        self.rewards = StepRewards(self.reward_fn, self.dims, self.ranks_per_group, self.device,
                                   self.models.placement.async_reward)
        self.eq_scales = self.sampler.grad_balance_scales() if cfg.update.use_grad_balancing else None
        self.reference_sampler = self.sampler.with_micro_batch(self.models.placement.reference_batch_size)
        self.window = SDEWindow(cfg.rollout.sde_window_size, cfg.rollout.sde_window_stride, cfg.rollout.grpo_sampling_steps)
        self.num_train_steps = trained_steps_per_sample(cfg)
        self.policy_pass = PolicyPass(cfg, self.sampler, self.models, self.dims, self.device, self.kl_mode,
                                      self.kl_controller, self.eq_scales, self.num_train_steps, self.show_bars,
                                      window_equalizer=cfg.update.sde_window_equalizer == "window" and self.window.enabled)
        self.height, self.width = rollout_size(cfg)
        self.global_step = self.update_steps = self.micro_steps = 0
        self.failed_reward_steps = 0  # consecutive steps that trained on nothing (pipeline/failed_steps.py)
        self.skipped_updates = 0  # optimizer updates of the current step whose gradient was not finite

        # Models and reward are loaded: only now does the run directory change.
        self.run_dir = run_on_main(self._prepare_run_dir, self.dims)
        trackers = (start_trackers(self.report_to, self.run_dir, project=cfg.output.tracker_project_name,
                                   run_name=cfg.output.run_name, config=to_dict(cfg),
                                   resuming=self.resume_check is not None or self.restart)
                    if self.is_main else ())
        self.logger = MetricsLogger(self.run_dir, enabled=self.is_main, log_interval=cfg.output.log_interval,
                                    trackers=trackers, max_steps=cfg.optim.max_steps)
        self.rollout_media = RolloutMedia(cfg, self.dims, self.ranks_per_group, self.logger, BackgroundWriter())
        self.validator = self._build_validator()
        self.sentinel = DriftSentinel(self.drift_watch, self.validator, self.logger.info)
        self.checkpoints = CheckpointManager(
            models=self.models, optimizer=self.optimizer, kl_controller=self.kl_controller,
            anchor_schedule=self.anchor, counters=self, dims=self.dims, run_dir=self.run_dir,
            keep_checkpoints=cfg.output.keep_checkpoints,
            layout=layout_record(cfg, self.dims.world_size, self.dp_size, self.dims.sp_size, self.items),
            config_yaml=partial(config_to_yaml, cfg), log=self.logger.info, ema=self.ema)
        self.logger.info_lines(startup_summary(cfg, self.dims, self.run_dir, self.device)
                               + [f"note: {note}" for note in self.notes])
        if self.dims.is_distributed:
            self.logger.info(f"{self.dims.world_size} processes: dp {self.dp_size} x sp {self.dims.sp_size}, "
                             f"FSDP {'on' if cfg.parallel.enable_fsdp else 'off'}")

    def _prepare_run_dir(self) -> Path:
        """The run directory, after the earlier run is cleared (``--overwrite_output_dir``); it always ends up with
        the values the run now uses in ``run_config.yaml`` (on resume too) and allowed run-defining changes recorded."""
        cfg, check = self.cfg, self.resume_check
        run_dir = self.run_claim.take(self.notes)  # locked, an earlier run or a later branch cleared (run_claim.py)
        if check is not None and check.differences:
            record_config_changes(run_dir, check)
            changes = ", ".join(f"{describe_setting(k)} {old!r} -> {new!r}" for k, (old, new) in
                                check.differences.items())
            self.notes.append(f"--allow_config_change: continuing {check.path} with changed settings: {changes} "
                              f"(recorded in {run_dir / CONFIG_CHANGES_FILE})")
        save_yaml(cfg, run_dir / RUN_MARKER)
        record_run_weights(cfg.model.pretrained_model_root, run_dir, run_dir / RUN_MARKER)  # the hub commits, if locked
        return run_dir

    # ------------------------------------------------------------------ outer loop
    def train(self) -> None:
        cfg = self.cfg
        if self.resume_check is not None:
            self.resume(self.resume_check.path)
        elif cfg.validation.validate_at_step0 or self.drift_watch.proxy:  # the proxy's baseline: the base model's samples
            self.validate(0)
        progress = tqdm(total=cfg.optim.max_steps, initial=self.global_step, desc="GRPO", disable=not self.show_bars,
                        dynamic_ncols=True)
        while self.global_step < cfg.optim.max_steps:
            self.maybe_refresh_anchor()  # a checkpoint saved before its refresh (an earlier version refreshed here)
            metrics = self.train_step()
            self.global_step += 1
            self.logger.log_step(self.global_step, metrics)
            self.failed_reward_steps = count_failed_step(  # the streak of steps that trained on nothing
                self.failed_reward_steps, self.global_step, step_failures(metrics, cfg.data.batch_size * self.dp_size),
                cfg.reward.max_failed_reward_steps, self.logger.info)
            self.sentinel.record_step(metrics)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['gathered_avg_reward_mean']:.4f}",
                                 kl=f"{metrics.get('kl_loss', 0.0):.2e}")
            if cfg.validation.validation_interval > 0 and self.global_step % cfg.validation.validation_interval == 0:
                self.validate(self.global_step)
            if self.global_step % cfg.output.save_interval == 0 or self.global_step == cfg.optim.max_steps:
                self.save()
        progress.close()
        self.rewards.close()
        self.rollout_media.flush()
        self.logger.info(f"training finished at step {self.global_step}; outputs in {self.run_dir}")
        self.logger.close()

    def train_step(self) -> Dict[str, float]:
        cfg, step = self.cfg, self.global_step
        items = [self.items[i] for i in self.prompt_sampler.indices(step)]
        prompts = [item.prompt for item in items]
        seeds = sample_seeds([item.seed for item in items], cfg.data.num_generations, self.dp_rank, cfg.data.batch_size,
                             cfg.rollout.use_same_noise)
        check_same_in_sp_group(self.dims, items=[item.index for item in items], seeds=seeds)
        timings: Dict[str, float] = {}
        self.skipped_updates = 0  # optimizer updates of this step whose gradient was not finite
        step_start = start = time.perf_counter()
        height, width = self._video_size(items[0])  # a batch is one task; its first image picks the bucket
        embeds = self._encode(items, (height, width))
        first = self.dp_rank * cfg.data.batch_size  # index of this rank's first sample in the step's global batch
        noise_generators = [torch.Generator().manual_seed(derived_seed(cfg.data.seed, step, first + slot, s))
                            for slot, s in enumerate(seeds)]
        rollout = self.sampler.rollout(self.models.policy, self.models.vae, embeds, seeds,
                                       num_frames=cfg.rollout.sample_n_frames, height=height, width=width,
                                       sde_generators=noise_generators, decode=False, progress=self.show_bars,
                                       deterministic=self.window.deterministic(self.update_steps))
        share_rollout(rollout, self.dims)
        # decoded by the SP group's ranks together, for the SP leader, which scores them and writes the rollout media
        final = rollout.latents[:, -1]
        videos = decode_across_sp_group(self.models.decode, final, self.models.video_shape(final), self.dims)
        timings["rollout_time"] = time.perf_counter() - start
        fault_point("rollout", step + 1)

        start = time.perf_counter()
        scoring = self.rewards.start(videos, prompts)  # scored now, or beside the reference pass (--async_reward)
        timings["reward_time"] = time.perf_counter() - start
        start = time.perf_counter()
        trained_steps = self.window.steps(self.update_steps)
        # the anchor's means, computed now (beside the reward worker) and again after a refresh between inner epochs
        reference = rl.AnchorMeans(partial(self.reference_means, rollout, embeds, trained_steps), self.anchor)
        start = time.perf_counter()
        rewards, group_rewards = self.rewards.collect(scoring)
        timings["reward_time"] += time.perf_counter() - start  # the reward's time on the step's critical path
        advantages = rl.local_advantages(group_rewards, cfg.data.num_generations, self.ranks_per_group,
                                         self.dp_rank % self.ranks_per_group, cfg.data.batch_size,
                                         self.reward_plan.aggregation)
        start = time.perf_counter()
        if cfg.output.save_rollout_videos and self.dims.is_sp_leader:
            self.rollout_media.write(self.run_dir, self.update_steps, self.global_step + 1,
                                     RolloutSamples(items, seeds, videos, rewards, advantages))
        timings["media_time"] = time.perf_counter() - start  # handing them to the writer (waiting when it lags)

        start, before = time.perf_counter(), reference.seconds
        metrics = run_inner_epochs(cfg.update.num_inner_epochs, partial(self.policy_update, rollout, embeds, advantages,
                                                                  reference, trained_steps, self.update_steps))
        timings["ref_model_time"] = reference.seconds  # with means recomputed after a refresh between epochs
        timings["grpo_loop_time"] = time.perf_counter() - start - (reference.seconds - before)
        timings["other_time"] = time.perf_counter() - step_start - sum(timings.values())  # the phases add up
        # the writer's own time, overlapping the phases (not in the step); on every rank, so the all-reduce matches
        timings["background_media_time"] = self.rollout_media.writer.seconds
        timings["background_reward_time"] = self.rewards.seconds  # the reward worker's time this step (0 in line)

        metrics = mean_over_world({**metrics, **timings}, self.device)
        metrics.update(rl.reward_statistics(gather_step_rewards(rewards, self.dims), cfg.data.num_generations))
        metrics["learning_rate"] = self.lr_schedule.lr_at(max(self.update_steps - 1, 0))
        metrics["update_steps"] = float(self.update_steps)
        if self.skipped_updates:  # logged only when it happens: the logged keys of a healthy run stay as they were
            metrics["skipped_updates"] = float(self.skipped_updates)
        return metrics

    # ------------------------------------------------------------------ phases
    def _video_size(self, item: PromptItem, validation: bool = False) -> Tuple[int, int]:
        """(H, W) of ``item``'s videos: ``--validation_fixed_size`` (validation), else ``--rollout_height/_width``
        when set; otherwise an image-to-video item at the bucket of ``--video_bucket_hw_base_size`` closest to its
        image, a text-to-video one at the rollout size."""
        cfg = self.cfg
        fixed = (cfg.rollout.rollout_height, cfg.rollout.rollout_width) if cfg.rollout.rollout_height is not None else None
        if validation:
            fixed = parse_size(cfg.validation.validation_fixed_size, "--validation_fixed_size") or fixed
        return video_size(item, fixed, cfg.rollout.video_bucket_hw_base_size, (self.height, self.width))

    def _check_i2v_tokens(self) -> None:
        """Sequence parallelism: every image-to-video bucket's token count splits over the SP ranks (the rollout
        size was checked with the layout)."""
        cfg = self.cfg
        if self.dims.sp_size == 1 or cfg.rollout.rollout_height is not None:
            return
        buckets = {video_size(item, None, cfg.rollout.video_bucket_hw_base_size, rollout_size(cfg))
                   for item in self.items if item.task == "i2v"}
        for height, width in sorted(buckets):
            tokens = video_tokens_at(cfg, cfg.rollout.sample_n_frames, height, width)
            if tokens is not None:
                self.dims.check_tokens(tokens)

    def _encode(self, items: List[PromptItem], size: Tuple[int, int]):
        """Prompt embeddings of ``items`` (one task), with the image condition of an image-to-video batch."""
        images = [item.ref_image_path for item in items] if items[0].task == "i2v" else None
        return self.models.encode([item.prompt for item in items], images, size)

    def reference_means(self, rollout, embeds, trained_steps: torch.Tensor) -> Optional[torch.Tensor]:
        """mu_ref of every stored transition, (B, N, C, T, h, w) on the device, ``--reference_batch_size`` transitions
        per forward; with the SDE window only those of ``trained_steps`` (never trained others); None without KL."""
        if self.models.reference is None or self.kl_controller is None:
            return None
        steps = trained_steps if self.window.enabled else None
        with self.models.reference_on_device() as reference:
            return self.reference_sampler.transition_means(reference, rollout.latents, embeds, self.device,
                                                           self.show_bars, steps=steps)

    def policy_update(self, rollout, embeds, advantages: torch.Tensor, reference: rl.AnchorMeans,
                      trained_steps: torch.Tensor, rollout_update: int, pass_index: int = 0) -> Dict[str, float]:
        """One pass (``rl.inner_epochs``) over the (sample, step) pairs of ``trained_steps``, at the anchor's means."""
        cfg = self.cfg
        shuffle, order = shuffled_pairs(pass_seed(cfg.data.seed, self.dp_rank, self.global_step, pass_index),
                                        rollout.latents.shape[0], trained_steps, cfg.update.enable_timestep_permutation)
        check_same_in_sp_group(self.dims, shuffle=shuffle.tolist(), order=order.tolist())
        closes_window = (self.micro_steps + 1) % self.cfg.optim.gradient_accumulation_steps == 0
        result = self.policy_pass.backward(rollout, embeds, advantages, reference.current(), shuffle, order,
                                           closes_window, self.global_step, self.update_steps == rollout_update)
        self.micro_steps += 1
        if self.micro_steps % self.cfg.optim.gradient_accumulation_steps == 0:
            result.update(self.optimizer_step())
            self.maybe_refresh_anchor()  # after exactly every --update_ref_model_step updates, at any K
        return result

    def optimizer_step(self) -> Dict[str, float]:
        cfg = self.cfg
        params = [p for _, p in self.models.trainable_named_parameters()]
        watched = _local(params[0]).detach().clone() if cfg.output.debug_grad_flow else None
        average_unsharded_gradients(params, self.dims)
        grad_norm = clip_gradients(params, clip_threshold(cfg))  # --max_grad_norm in --max_grad_norm_units
        if finite_update(grad_norm):  # a NaN or inf gradient is never applied (pipeline/failed_steps.py)
            self.lr_schedule.apply(self.optimizer, self.update_steps)
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
        else:
            self.skipped_updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.update_steps += 1
        metrics = {"grad_norm": float(grad_norm)}
        if watched is not None and self.update_steps % cfg.output.debug_train_diagnostics_interval == 0:
            delta = (_local(params[0]).detach() - watched).abs().flatten()[:4096]
            metrics.update(param_delta_mean=float(delta.mean()), param_delta_max=float(delta.max()))
        return metrics

    def maybe_refresh_anchor(self) -> None:
        """Moving anchor: copy the policy into the reference model every ``update_ref_model_step`` updates."""
        if self.anchor.should_refresh(self.update_steps):
            self.models.copy_policy_to_reference()
            self.anchor.mark_refreshed(self.update_steps)
            self.logger.info(f"moving anchor refreshed from the policy at update {self.update_steps}")

    # ------------------------------------------------------------------ validation
    def _build_validator(self) -> Validator:
        """The validation step (:mod:`sage_grpo.pipeline.validation`): sampling, then the training reward and its
        sub-rewards on the videos (where the reward lives, on the main process), then the held-out metrics."""
        cfg = self.cfg
        size = validation_size(cfg)
        settings = ValidationSettings(tuple(self.validation_items), cfg.validation.validate_video_length, cfg.rollout.video_fps,
                                      lambda item: self._video_size(item, validation=True) if item.task == "i2v"
                                      else size)
        sampler = self.validation_sampler or self.sampler.with_schedule(cfg.validation.validation_num_inference_steps,
                                                                        validation_flow_shift(cfg))
        validator = Validator(settings, sampler, self.models, is_main=self.is_main, encode=self._encode,
                              log_videos=partial(self.logger.log_videos, VALIDATION_VIDEOS))
        if self.reward_fn is not None:
            validator.add_metric(VideoScoreMetric("reward", per_video(self.reward_fn)))
        if self.held_out is not None:
            validator.add_metric(VideoScoreMetric("held_out", self.held_out))
        return validator

    def validate(self, step: int) -> ValidationResult:
        """Deterministic (ODE) samples of the validation prompts, written to samples/step_{step:06d}/ and scored;
        the ``Validation/...`` metrics are logged as a row of their own at ``step``. Every rank calls it."""
        out_dir = self.run_dir / "samples" / f"step_{step:06d}"
        with self.ema.applied() if self.cfg.validation.validate_ema else nullcontext():  # --validate_ema: the EMA weights
            result = self.validator.run(step, out_dir)
        added, alarms = self.sentinel.observe(step, result.metrics)
        self.logger.log_validation(step, {**result.metrics, **added})
        self.logger.info(f"validation videos written to {out_dir}")
        self.sentinel.act(step, alarms, partial(run_on_main, partial(list_checkpoints, self.run_dir), self.dims),
                          self.save, self.checkpoints.roll_back)  # every rank alike: rank 0's metrics and checkpoints
        return result

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The counters as the training state holds them (saved and restored by the checkpoint manager), the streak of
        all-failed reward steps (a resume does not reset it) and the drift guard's state too."""
        return {"global_step": self.global_step, "update_steps": self.update_steps, "micro_steps": self.micro_steps,
                "failed_reward_steps": self.failed_reward_steps, **self.sentinel.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.global_step, self.update_steps = state["global_step"], state["update_steps"]
        self.micro_steps, self.failed_reward_steps = state["micro_steps"], state.get("failed_reward_steps", 0)
        self.sentinel.load_state_dict(state)

    def save(self) -> Path:
        """Write ``checkpoint-{global_step}``: called by every rank."""
        self.rollout_media.flush()  # a checkpoint's step has all of its media on disk
        path = self.checkpoints.save(self.global_step)
        self.logger.info(f"checkpoint saved to {path}")
        return path

    def resume(self, path: Path) -> None:
        """Restore from the checkpoint :func:`~sage_grpo.resume.check_resume` accepted: a sharded one on any number
        of processes, a one-process one on one process."""
        self.checkpoints.load(path, self.resume_check.training_state)
        if self.is_main:
            truncate_metrics(self.run_dir, self.global_step)
        self.logger.info(f"resumed from {path} at step {self.global_step} (update {self.update_steps})")


def run_training(cfg: TrainConfig) -> GRPOTrainer:
    try:
        trainer = GRPOTrainer(cfg)
        with trainer.peers.guard("training"):  # a stopped or lost rank is named, within the collective timeout
            trainer.train()
            barrier(trainer.dims.device)  # every rank is done with every collective before the process group goes
    finally:
        release_run_locks()  # the run directory is free again, however the run ended
    destroy_distributed()
    return trainer

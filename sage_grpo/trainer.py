"""The SAGE-GRPO trainer (docs/reference.md): one outer step is

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

Start-up: :func:`sage_grpo.startup.resolve` makes every decision of the run before any model loads (the frozen
:class:`~sage_grpo.startup.plan.RunPlan`: layout, KL mode, reward plan, placement, sizes, resume, ...) and
:mod:`sage_grpo.startup.build` builds the parts from it; each stage gets the sections and plan entries it uses.

Checkpoints: a :class:`~sage_grpo.checkpoint.CheckpointManager`, built once with what the trainer owns (the model
bundle, the optimizer, the KL controller, the anchor schedule, the EMA of ``--ema_decay``, and the trainer itself for
its counters through ``state_dict``/``load_state_dict``), saves and restores all of it; the loop only says when.

Several processes (``torchrun``; docs/reference.md). ``world = dp x sp`` with contiguous SP groups
(``ParallelDims``); the layout rules are checked before any model loads. The policy and the reference get Ulysses SP
and FSDP2 from :func:`~sage_grpo.distributed.parallelize.parallelize_models`; the optimizer is built afterwards.

* Data: the sampler deals prompt groups over the DP ranks; a group spans ``G / B`` DP ranks when ``B < G``. Every rank
  of an SP group derives its prompts, seeds, SDE noise and permutations from its ``dp_rank`` and so sees the same
  samples (asserted each step); the stored rollout is broadcast from the SP leader.
* Rewards: the final latents are decoded (VAE) and scored once per SP group, on its leader, and broadcast; a group
  spread over DP ranks is gathered so its advantages are normalized over the whole group, each rank keeping its
  slice. Reward statistics are over all ``B x dp`` samples of the step; loss, KL and timing metrics are averaged over
  the world.
* Gradients: FSDP reduces (mean over every rank: DP mean and SP correction) only on the last backward of an accumulation
  window (``gradient_sync``): one reduce-scatter per optimizer update instead of the reference's one per backward
  (docs/reference.md#d20), at the price of holding the unsharded fp32 gradients between backwards. Without FSDP the
  gradients are averaged once per update.
* KL controller: fed the world-mean KL of each inner iteration, so every rank has the same beta (the reference keeps
  unsynchronized per-rank controllers, docs/reference.md#d12) and rank 0's checkpoint describes every rank.
* Files: the run directory, console, metrics, TensorBoard and validation videos are written by rank 0; rollout media
  by each SP leader (names carry the dp rank and the global rank); checkpoints by every rank together (DCP shards,
  ``CheckpointManager.save``). Every collective, the end-of-training checkpoint included, is entered by every rank
  (the reference's rank-0-only final save deadlocks, docs/reference.md#d5).
* Seeds: the models are built under ``--seed`` on every rank, then the global RNGs are seeded ``seed + dp_rank``
  (:mod:`sage_grpo.startup.build`).
"""

import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

from sage_grpo import rl
from sage_grpo.checkpoint import list_checkpoints
from sage_grpo.config.validation import ConfigError, parse_size
from sage_grpo.data import GroupedPromptSampler, PromptItem, sample_seeds, video_size
from sage_grpo.distributed import barrier, destroy_distributed, mean_over_world
from sage_grpo.distributed.liveness import PeerLost
from sage_grpo.distributed.parallelize import average_unsharded_gradients, clip_gradients, clip_threshold
from sage_grpo.distributed.rollout_sync import (check_same_in_sp_group, decode_across_sp_group, gather_step_rewards,
                                                run_on_main, share_rollout)
from sage_grpo.faults import fault_point
from sage_grpo.models.layout import MissingCheckpointError
from sage_grpo.pipeline.drift import DriftGuardStop, DriftSentinel
from sage_grpo.pipeline.failed_steps import count_failed_step, finite_update, step_failures
from sage_grpo.pipeline.rollout_media import RolloutMedia, RolloutSamples
from sage_grpo.pipeline.validation import ValidationResult
from sage_grpo.rewards.remote import RemoteRewardError
from sage_grpo.rewards.setup import RewardFailure
from sage_grpo.rl.inner_epochs import derived_seed, pass_seed, run_inner_epochs, shuffled_pairs
from sage_grpo.safe_io import CheckpointError, DiskFullError
from sage_grpo.startup import Startup, resolve
from sage_grpo.startup.build import build_parts, checkpoints_of, validator_of
from sage_grpo.startup.run_files import open_logger, take_run_dir
from sage_grpo.tracking.run_claim import release_run_locks
from sage_grpo.tracking.run_dir import show_progress_bars, truncate_metrics
from sage_grpo.tracking.trackers import VALIDATION_VIDEOS
from sage_grpo.video_io import BackgroundWriter

# Errors a user causes (a flag, a file, a plug-in, a reward that keeps failing): post_train.py prints their message as
# one line instead of a traceback.
USER_ERRORS = (ConfigError, CheckpointError, MissingCheckpointError, FileNotFoundError, RewardFailure,
               RemoteRewardError, PeerLost, DiskFullError, DriftGuardStop)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP parameter (the tensor itself when unsharded)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@contextmanager
def _timed(timings: Dict[str, float], phase: str) -> Iterator[None]:
    """Add the block's wall time to ``timings[phase]``."""
    start = time.perf_counter()
    yield
    timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


class GRPOTrainer:
    """Everything a start can check is checked before any model loads (:func:`sage_grpo.startup.resolve`: the
    configuration, the prompt CSVs, the reward configuration and its plug-ins, the resume target and its
    compatibility, the run directory); the run directory is touched (an earlier run deleted under
    ``--overwrite_output_dir``, ``run_config.yaml`` and ``run_plan.json`` written) only once the models and the
    reward have loaded, so a failed start leaves an earlier run as it was. ``cfg``: the training configuration
    (``TrainConfig``); ``start``: its resolution when the caller made it (``post_train.py``), else made here."""

    def __init__(self, cfg, start: Optional[Startup] = None):
        start = start if start is not None else resolve(cfg)
        self.cfg, self.plan, self.dims, self.peers = start.cfg, start.plan, start.dims, start.peers
        self.dp_rank, self.dp_size, self.is_main = self.dims.dp_rank, self.dims.dp_size, self.dims.is_main
        self.notes = list(self.plan.notes)
        self.show_bars = show_progress_bars(self.is_main, self.cfg.output.quiet)  # main process, terminal, no --quiet
        self.items, self.validation_items = start.items, start.validation_items
        self.sampler, self.validation_sampler = start.sampler, start.validation_sampler
        self.lr_schedule, self.window = start.lr_schedule, self.plan.schedule.window
        data = self.cfg.data
        self.prompt_sampler = GroupedPromptSampler(len(self.items), data.batch_size, data.num_generations,
                                                   self.dp_size, self.dp_rank, data.seed,
                                                   tasks=[item.task for item in self.items])
        parts = build_parts(start)  # the models, the reward, the optimizer, ... (sage_grpo/startup/build.py)
        self.models, self.device = parts.models, parts.models.device
        self.reward_fn, self.held_out, self.rewards = parts.reward_fn, parts.held_out, parts.rewards
        self.optimizer, self.ema = parts.optimizer, parts.ema
        self.kl_controller, self.anchor = parts.kl_controller, parts.anchor
        self.reference_sampler, self.policy_pass = parts.reference_sampler, parts.policy_pass
        self.global_step = self.update_steps = self.micro_steps = 0
        self.failed_reward_steps = 0  # consecutive steps that trained on nothing (pipeline/failed_steps.py)
        self.skipped_updates = 0  # optimizer updates of the current step whose gradient was not finite

        # Models and reward are loaded: only now does the run directory change.
        self.run_dir = run_on_main(partial(take_run_dir, self.cfg, self.plan, start.run_claim, self.notes), self.dims)
        self.logger = open_logger(self.cfg, self.plan, start.report_to, self.run_dir, self.is_main)
        self.rollout_media = RolloutMedia(data, self.cfg.rollout.video_fps, self.cfg.output.keep_rollout_steps,
                                          self.dims, self.plan.layout.ranks_per_group, self.logger, BackgroundWriter())
        self.validator = validator_of(start, parts, partial(self._video_size, validation=True), self._encode,
                                      partial(self.logger.log_videos, VALIDATION_VIDEOS))
        self.sentinel = DriftSentinel(self.plan.drift_watch, self.validator, self.logger.info)
        self.checkpoints = checkpoints_of(start, parts, self, self.run_dir, self.logger.info)
        self.logger.info_lines(self.plan.lines(self.run_dir) + [f"note: {note}" for note in self.notes])

    # ------------------------------------------------------------------ outer loop
    def train(self) -> None:
        """Resume (or the step-0 validation), then steps until ``--max_steps``: each logged, counted against the
        failed-reward streak and the drift guard, validated and checkpointed at their intervals."""
        cfg = self.cfg
        if self.plan.resume.check is not None:
            self.resume(self.plan.resume.check.path)
        elif cfg.validation.validate_at_step0 or self.plan.drift_watch.proxy:  # the proxy's baseline: the base model
            self.validate(0)
        progress = tqdm(total=cfg.optim.max_steps, initial=self.global_step, desc="GRPO", disable=not self.show_bars,
                        dynamic_ncols=True)
        while self.global_step < cfg.optim.max_steps:
            self.maybe_refresh_anchor()  # a checkpoint saved before its refresh (an earlier version refreshed here)
            metrics = self.train_step()
            self.global_step += 1
            self._record_step(metrics)
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

    def _record_step(self, metrics: Dict[str, float]) -> None:
        """Log the step's metrics; count the streak of steps that trained on nothing; show them to the drift guard."""
        self.logger.log_step(self.global_step, metrics)
        self.failed_reward_steps = count_failed_step(
            self.failed_reward_steps, self.global_step, step_failures(metrics, self.plan.layout.videos_per_step),
            self.cfg.reward.max_failed_reward_steps, self.logger.info)
        self.sentinel.record_step(metrics)

    def train_step(self) -> Dict[str, float]:
        """One outer step (module docstring): rollout -> reward (started) -> reference means -> reward (collected)
        -> group advantages -> policy update (with the anchor's refreshes); returns the step's metrics."""
        self.skipped_updates = 0  # optimizer updates of this step whose gradient was not finite
        items, seeds = self._step_prompts(self.global_step)
        timings: Dict[str, float] = {}
        step_start = time.perf_counter()
        with _timed(timings, "rollout_time"):
            rollout, embeds, videos = self._rollout(items, seeds)
        fault_point("rollout", self.global_step + 1)
        with _timed(timings, "reward_time"):  # scored now, or beside the reference pass (--async_reward)
            scoring = self.rewards.start(videos, [item.prompt for item in items])
        trained_steps = self.window.steps(self.update_steps)
        # the anchor's means, computed now (beside the reward worker) and again after a refresh between inner epochs
        reference = rl.AnchorMeans(partial(self.reference_means, rollout, embeds, trained_steps), self.anchor)
        with _timed(timings, "reward_time"):  # the reward's time on the step's critical path
            rewards, group_rewards = self.rewards.collect(scoring)
        advantages = self._advantages(group_rewards)
        with _timed(timings, "media_time"):  # handing them to the writer (waiting when it lags)
            if self.cfg.output.save_rollout_videos and self.dims.is_sp_leader:
                self.rollout_media.write(self.run_dir, self.update_steps, self.global_step + 1,
                                         RolloutSamples(items, seeds, videos, rewards, advantages))
        start, before = time.perf_counter(), reference.seconds
        metrics = run_inner_epochs(self.cfg.update.num_inner_epochs, partial(
            self.policy_update, rollout, embeds, advantages, reference, trained_steps, self.update_steps))
        timings["ref_model_time"] = reference.seconds  # with means recomputed after a refresh between epochs
        timings["grpo_loop_time"] = time.perf_counter() - start - (reference.seconds - before)
        timings["other_time"] = time.perf_counter() - step_start - sum(timings.values())  # the phases add up
        return self._step_metrics(metrics, timings, rewards)

    # ------------------------------------------------------------------ phases
    def _step_prompts(self, step: int) -> Tuple[List[PromptItem], List[int]]:
        """This rank's prompts of ``step`` and their initial-noise seeds (the same on every rank of an SP group)."""
        data = self.cfg.data
        items = [self.items[i] for i in self.prompt_sampler.indices(step)]
        seeds = sample_seeds([item.seed for item in items], data.num_generations, self.dp_rank, data.batch_size,
                             self.cfg.rollout.use_same_noise)
        check_same_in_sp_group(self.dims, items=[item.index for item in items], seeds=seeds)
        return items, seeds

    def _rollout(self, items: List[PromptItem], seeds: List[int]):
        """(rollout, prompt embeddings, decoded videos) of ``items``: sampled with the SDE at every step (ODE steps
        outside the SDE window), shared from the SP leader, decoded by the SP group's ranks together."""
        step, height, width = self.global_step, *self._video_size(items[0])  # a batch is one task
        embeds = self._encode(items, (height, width))
        first = self.dp_rank * self.cfg.data.batch_size  # this rank's first sample in the step's global batch
        noise_generators = [torch.Generator().manual_seed(derived_seed(self.cfg.data.seed, step, first + slot, s))
                            for slot, s in enumerate(seeds)]
        rollout = self.sampler.rollout(self.models.policy, self.models.vae, embeds, seeds,
                                       num_frames=self.plan.schedule.rollout.frames, height=height, width=width,
                                       sde_generators=noise_generators, decode=False, progress=self.show_bars,
                                       deterministic=self.window.deterministic(self.update_steps))
        share_rollout(rollout, self.dims)
        final = rollout.latents[:, -1]
        videos = decode_across_sp_group(self.models.decode, final, self.models.video_shape(final), self.dims)
        return rollout, embeds, videos

    def _advantages(self, group_rewards) -> torch.Tensor:
        """This rank's slice of the group advantages (a group spread over DP ranks normalized as a whole)."""
        ranks_per_group = self.plan.layout.ranks_per_group
        return rl.local_advantages(group_rewards, self.cfg.data.num_generations, ranks_per_group,
                                   self.dp_rank % ranks_per_group, self.cfg.data.batch_size,
                                   self.plan.reward.aggregation)

    def _step_metrics(self, metrics: Dict[str, float], timings: Dict[str, float], rewards) -> Dict[str, float]:
        """The step's world-mean metrics and phase times, the reward statistics over every sample of the step and
        the schedule's counters."""
        # the writer's own time, overlapping the phases (not in the step); on every rank, so the all-reduce matches
        timings["background_media_time"] = self.rollout_media.writer.seconds
        timings["background_reward_time"] = self.rewards.seconds  # the reward worker's time this step (0 in line)
        metrics = mean_over_world({**metrics, **timings}, self.device)
        metrics.update(rl.reward_statistics(gather_step_rewards(rewards, self.dims), self.cfg.data.num_generations))
        metrics["learning_rate"] = self.lr_schedule.lr_at(max(self.update_steps - 1, 0))
        metrics["update_steps"] = float(self.update_steps)
        if self.skipped_updates:  # logged only when it happens: the logged keys of a healthy run stay as they were
            metrics["skipped_updates"] = float(self.skipped_updates)
        return metrics

    def _video_size(self, item: PromptItem, validation: bool = False) -> Tuple[int, int]:
        """(H, W) of ``item``'s videos: ``--validation_fixed_size`` (validation), else ``--rollout_height/_width``
        when set; otherwise an image-to-video item at the bucket of ``--video_bucket_hw_base_size`` closest to its
        image, a text-to-video one at the rollout size."""
        rollout, size = self.cfg.rollout, self.plan.schedule.rollout
        fixed = (rollout.rollout_height, rollout.rollout_width) if rollout.rollout_height is not None else None
        if validation:
            fixed = parse_size(self.cfg.validation.validation_fixed_size, "--validation_fixed_size") or fixed
        return video_size(item, fixed, rollout.video_bucket_hw_base_size, (size.height, size.width))

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
        closes_window = (self.micro_steps + 1) % cfg.optim.gradient_accumulation_steps == 0
        result = self.policy_pass.backward(rollout, embeds, advantages, reference.current(), shuffle, order,
                                           closes_window, self.global_step, self.update_steps == rollout_update)
        self.micro_steps += 1
        if self.micro_steps % cfg.optim.gradient_accumulation_steps == 0:
            result.update(self.optimizer_step())
            self.maybe_refresh_anchor()  # after exactly every --update_ref_model_step updates, at any K
        return result

    def optimizer_step(self) -> Dict[str, float]:
        output = self.cfg.output
        params = [p for _, p in self.models.trainable_named_parameters()]
        watched = _local(params[0]).detach().clone() if output.debug_grad_flow else None
        average_unsharded_gradients(params, self.dims)
        grad_norm = clip_gradients(params, clip_threshold(self.cfg.optim, self.dims.sp_size))  # in its units
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
        if watched is not None and self.update_steps % output.debug_train_diagnostics_interval == 0:
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
    def validate(self, step: int) -> ValidationResult:
        """Deterministic (ODE) samples of the validation prompts, written to samples/step_{step:06d}/ and scored;
        the ``Validation/...`` metrics are logged as a row of their own at ``step``. Every rank calls it."""
        out_dir = self.run_dir / "samples" / f"step_{step:06d}"
        with self.ema.applied() if self.cfg.validation.validate_ema else nullcontext():  # --validate_ema
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
        self.checkpoints.load(path, self.plan.resume.check.training_state)
        if self.is_main:
            truncate_metrics(self.run_dir, self.global_step)
        self.logger.info(f"resumed from {path} at step {self.global_step} (update {self.update_steps})")


def run_training(cfg, start: Optional[Startup] = None) -> GRPOTrainer:
    """Train ``cfg`` (resolved here unless ``start`` holds its resolution) and end the process group."""
    try:
        trainer = GRPOTrainer(cfg, start)
        with trainer.peers.guard("training"):  # a stopped or lost rank is named, within the collective timeout
            trainer.train()
            barrier(trainer.dims.device)  # every rank is done with every collective before the process group goes
    finally:
        release_run_locks()  # the run directory is free again, however the run ended
    destroy_distributed()
    return trainer

"""The SAGE-GRPO trainer (reference_spec §2): one outer step is

    rollout  ->  reward  ->  group advantages  ->  reference means  ->  policy update  ->  (anchor refresh)

* Rollout: every prompt of this rank's batch is sampled with the SDE sampler (``--sde_type``) at all
  ``grpo_sampling_steps`` steps, storing the latents x_0..x_N and the per-step log-probs log pi_old(x_{k+1} | x_k).
* Reward: the reward stack scores the decoded videos; ``avg`` is the GRPO reward. Failed rewards are NaN.
* Advantages: per-group population z-score with a 1e-6 floor (NaN rewards excluded, advantage 0).
* Reference means: the KL anchor's SDE means mu_ref on the stored transitions, computed before training (the
  reference's ``rollout_phase`` mode) so the policy pass needs no second model.
* Policy update: samples are shuffled and each sample's steps permuted; every (sample, step) pair gets the PPO clipped
  loss times the equalizer scale of its *original* step, plus beta * (w_m * KL_mean-matching + w_s * KL_step-wise) with
  beta from the adaptive controller. Gradients accumulate into one optimizer update per
  ``--gradient_accumulation_steps`` rollout batches.
* Anchor: every ``--update_ref_model_step`` updates the reference model is overwritten with the policy (the moving
  anchor), before the next rollout.

Randomness is derived from (seed, step, sample) so that resuming needs only the counters: the initial noise of a
sample uses its CSV-derived seed (reference), its SDE noise a generator seeded from (seed, global step, slot), and the
shuffles a generator seeded from (seed, dp rank, global step).
"""

import json
import math
import re
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from tqdm.auto import tqdm

from sage_grpo import rl, sde
from sage_grpo.checkpoint import (capture_rng_state, load_checkpoint, prune_checkpoints, resolve_resume_path,
                                  restore_rng_state, save_checkpoint)
from sage_grpo.config import TrainConfig, save_yaml, validate_train_config
from sage_grpo.config.schema import to_dict
from sage_grpo.config.validation import group_layout, parse_reward_weights, parse_size, rollout_size
from sage_grpo.data import GroupedPromptSampler, PromptItem, read_prompt_csvs, sample_seeds
from sage_grpo.optim import LRSchedule, build_optimizer
from sage_grpo.tracking import MetricsLogger, prepare_run_dir, prune_rollout_media, truncate_metrics
from sage_grpo.trainer_setup import ModelBundle, build_models, build_reward
from sage_grpo.video_io import sanitize_name, write_video

DEFAULT_VALIDATION_PROMPT = "A beautiful sunset over the ocean with waves gently crashing on the shore"


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (Python hashes tuples of ints deterministically across processes)."""
    return hash(tuple(int(p) for p in parts)) & 0x7FFF_FFFF_FFFF_FFFF


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class GRPOTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.dp_rank, self.dp_size, self.is_main = 0, 1, True
        self.notes = validate_train_config(cfg, world_size=1)
        self.items = read_prompt_csvs(cfg.train_video_csv)
        self.validation_items = self._validation_items()
        self.reward_weights = parse_reward_weights(cfg.reward_weights)
        self.run_dir = prepare_run_dir(cfg.output_dir, resuming=cfg.resume_from_checkpoint is not None,
                                       overwrite=cfg.overwrite_output_dir)
        if cfg.resume_from_checkpoint is None:
            save_yaml(cfg, self.run_dir / "run_config.yaml")
        self.logger = MetricsLogger(self.run_dir, enabled=self.is_main, log_interval=cfg.log_interval)
        for note in self.notes:
            self.logger.info(f"note: {note}")

        self.models: ModelBundle = build_models(cfg)
        self.device = self.models.device
        self.reward_fn = build_reward(cfg, self.device)
        self.optimizer = build_optimizer(self.models.trainable_named_parameters(), use_muon=cfg.use_muon,
                                         lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.lr_schedule = LRSchedule(cfg.lr_scheduler, cfg.learning_rate, cfg.warmup_steps)
        self.kl_mode = rl.kl_mode(cfg.kl_weight, cfg.use_moving_KL, cfg.use_dual_kl)
        self.kl_controller = (rl.AdaptiveKLController.from_flags(cfg.kl_weight, cfg.kl_coef, cfg.kl_min_coef)
                              if self.models.reference is not None else None)
        self.anchor = rl.MovingAnchorSchedule(cfg.use_moving_KL and self.models.reference is not None,
                                              cfg.update_ref_model_step)
        self.sampler = GroupedPromptSampler(len(self.items), cfg.batch_size, cfg.num_generations, self.dp_size,
                                            self.dp_rank, cfg.seed)
        self.ranks_per_group, _ = group_layout(cfg.batch_size, cfg.num_generations)
        self.sigmas = sde.shifted_sigmas(cfg.grpo_sampling_steps, cfg.infer_flow_shift_video)
        self.eq_scales = (sde.grad_balance_scales(cfg.sde_type, self.sigmas, cfg.eta)
                          if cfg.use_grad_balancing else None)
        self.num_train_steps = max(int(cfg.grpo_sampling_steps * cfg.timestep_fraction), 1)
        self.height, self.width = rollout_size(cfg)
        self.global_step = self.update_steps = self.micro_steps = 0

    # ------------------------------------------------------------------ outer loop
    def train(self) -> None:
        cfg = self.cfg
        if cfg.resume_from_checkpoint is not None:
            self.resume(resolve_resume_path(cfg.resume_from_checkpoint, self.run_dir))
        elif cfg.validate_at_step0:
            self.validate(0)
        progress = tqdm(total=cfg.max_steps, initial=self.global_step, desc="GRPO", disable=not self.is_main,
                        dynamic_ncols=True)
        while self.global_step < cfg.max_steps:
            self.maybe_refresh_anchor()
            metrics = self.train_step()
            self.global_step += 1
            self.logger.log_step(self.global_step, metrics)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['gathered_avg_reward_mean']:.4f}",
                                 kl=f"{metrics.get('kl_loss', 0.0):.2e}")
            if cfg.validation_interval > 0 and self.global_step % cfg.validation_interval == 0:
                self.validate(self.global_step)
            if self.global_step % cfg.save_interval == 0 or self.global_step == cfg.max_steps:
                self.save()
        progress.close()
        self.logger.info(f"training finished at step {self.global_step}; outputs in {self.run_dir}")
        self.logger.close()

    def train_step(self) -> Dict[str, float]:
        cfg, step = self.cfg, self.global_step
        items = [self.items[i] for i in self.sampler.indices(step)]
        prompts = [item.prompt for item in items]
        seeds = sample_seeds([item.seed for item in items], cfg.num_generations, self.dp_rank, cfg.batch_size,
                             cfg.use_same_noise)
        timings: Dict[str, float] = {}

        start = time.perf_counter()
        embeds = self.models.encode(prompts)
        noise_generators = [_generator(derived_seed(cfg.seed, step, self.dp_rank, slot, s))
                            for slot, s in enumerate(seeds)]
        rollout = self.models.rollout(embeds, seeds=seeds, sigmas=self.sigmas, sde_generators=noise_generators,
                                      height=self.height, width=self.width)
        timings["rollout_time"] = time.perf_counter() - start

        start = time.perf_counter()
        rewards = self.models.score(self.reward_fn, rollout.videos, prompts)
        timings["reward_time"] = time.perf_counter() - start
        advantages = rl.local_advantages(rewards["avg"], cfg.num_generations, self.ranks_per_group,
                                         self.dp_rank % self.ranks_per_group, cfg.batch_size)
        self._write_rollout_media(items, seeds, rollout.videos, rewards, advantages)

        start = time.perf_counter()
        ref_means = self.reference_means(rollout, embeds)
        timings["ref_model_time"] = time.perf_counter() - start

        start = time.perf_counter()
        metrics = self.policy_update(rollout, embeds, advantages, ref_means)
        timings["grpo_loop_time"] = time.perf_counter() - start

        metrics.update(timings)
        metrics.update(self._reward_metrics(rewards))
        metrics["learning_rate"] = self.lr_schedule.lr_at(max(self.update_steps - 1, 0))
        metrics["update_steps"] = float(self.update_steps)
        return metrics

    # ------------------------------------------------------------------ phases
    @torch.no_grad()
    def reference_means(self, rollout, embeds) -> Optional[torch.Tensor]:
        """mu_ref of every stored transition, (B, N, C, T, h, w) on CPU; None without a KL reference."""
        if self.models.reference is None or self.kl_controller is None:
            return None
        latents = rollout.latents
        with self.models.reference_on_device() as reference:
            means = []
            for i in range(latents.shape[0]):
                per_step = []
                for k in range(self.cfg.grpo_sampling_steps):
                    out = self.models.replay(reference, latents[i:i + 1, k], latents[i:i + 1, k + 1], k,
                                             embeds.select([i]), sigmas=self.sigmas)
                    per_step.append(out.mean.cpu())
                means.append(torch.cat(per_step, 0))
        return torch.stack(means, 0)

    def _permutations(self, batch: int) -> tuple:
        """Sample shuffle (B,) and per-sample step order (B, N), from a generator seeded by (seed, rank, step)."""
        generator = _generator(derived_seed(self.cfg.seed, self.dp_rank, self.global_step, 7))
        num_steps = self.cfg.grpo_sampling_steps
        shuffle = torch.randperm(batch, generator=generator)
        if self.cfg.enable_timestep_permutation:
            order = torch.stack([torch.randperm(num_steps, generator=generator) for _ in range(batch)])
        else:  # the reference crashes here with the equalizer on (spec §10.8); a (B, N) identity order works
            order = torch.arange(num_steps).repeat(batch, 1)
        return shuffle, order

    def policy_update(self, rollout, embeds, advantages: torch.Tensor,
                      ref_means: Optional[torch.Tensor]) -> Dict[str, float]:
        cfg = self.cfg
        batch = rollout.latents.shape[0]
        shuffle, order = self._permutations(batch)
        micro = cfg.mini_batch_size_per_update
        # One backward per (mini-batch, trained step); dividing by the number of backward passes of the whole
        # accumulation window makes the update the mean over samples and steps (reference GA = B * N for mb = 1).
        backward_per_update = cfg.gradient_accumulation_steps * self.num_train_steps * (batch // micro)
        history: Dict[str, List[float]] = {}
        self.models.policy.train()
        for start in range(0, batch, micro):
            rows = shuffle[start:start + micro]
            sub_embeds = embeds.select(rows.tolist())
            for position in range(self.num_train_steps):
                steps = order[rows, position]                         # (mb,) original step index k
                index = steps.to(self.device)
                lat = rollout.latents.to(self.device)
                x = lat[rows, steps]
                x_next = lat[rows, steps + 1]
                out = self.models.replay(self.models.policy, x, x_next, index, sub_embeds, sigmas=self.sigmas)
                old_lp = rollout.log_probs[rows, steps].to(self.device)
                scale = self.eq_scales[steps].to(self.device) if self.eq_scales is not None else None
                policy_loss, metrics = rl.ppo_clipped_loss(out.log_prob, old_lp, advantages[rows].to(self.device),
                                                           cfg.clip_range, cfg.adv_clip_max, scale)
                loss = policy_loss
                if self.kl_controller is not None and ref_means is not None:
                    beta = self.kl_controller.kl_coef
                    ref_mean = ref_means[rows, steps].to(self.device)
                    effective_kl, parts = rl.dual_kl(out.mean, ref_mean, out.std, old_lp, out.log_prob,
                                                     cfg.use_dual_kl, cfg.dual_kl_moving_weight,
                                                     cfg.dual_kl_step_weight)
                    self.kl_controller.update(float(effective_kl.detach()))
                    if beta > 0:
                        loss = policy_loss + beta * effective_kl
                    metrics.update(kl_loss=effective_kl.detach(), KL_weight=beta, **parts)
                metrics["total_loss"] = loss.detach()
                (loss / backward_per_update).backward()
                for name, value in metrics.items():
                    history.setdefault(name, []).append(float(value))
        self.micro_steps += 1
        result = {name: sum(values) / len(values) for name, values in history.items()}
        if "KL_weight" in history:
            result["KL_weight"] = history["KL_weight"][-1]
        if self.micro_steps % cfg.gradient_accumulation_steps == 0:
            result.update(self.optimizer_step())
        return result

    def optimizer_step(self) -> Dict[str, float]:
        cfg = self.cfg
        params = [p for _, p in self.models.trainable_named_parameters()]
        watched = params[0].detach().clone() if cfg.debug_grad_flow else None
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True)
        self.lr_schedule.apply(self.optimizer, self.update_steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.update_steps += 1
        metrics = {"grad_norm": float(grad_norm)}
        if watched is not None and self.update_steps % cfg.debug_train_diagnostics_interval == 0:
            delta = (params[0].detach() - watched).abs().flatten()[:4096]
            metrics.update(param_delta_mean=float(delta.mean()), param_delta_max=float(delta.max()))
        return metrics

    def maybe_refresh_anchor(self) -> None:
        """Moving anchor: copy the policy into the reference model every ``update_ref_model_step`` updates."""
        if self.anchor.should_refresh(self.update_steps):
            self.models.copy_policy_to_reference()
            self.anchor.mark_refreshed(self.update_steps)
            self.logger.info(f"moving anchor refreshed from the policy at update {self.update_steps}")

    # ------------------------------------------------------------------ rewards and media
    def _reward_metrics(self, rewards: Dict[str, torch.Tensor]) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        for name, values in {**rewards, "ori_avg": rewards["avg"]}.items():
            finite = values[torch.isfinite(values)].float()
            metrics[f"gathered_{name}_reward_mean"] = float(finite.mean()) if finite.numel() else math.nan
            metrics[f"gathered_{name}_reward_std"] = (float(finite.std(unbiased=False)) if finite.numel()
                                                      else math.nan)
        metrics["zero_std_group_fraction"] = float(rl.zero_spread_fraction(rewards["avg"], self.group_size_local))
        metrics["failed_reward_count"] = float((~torch.isfinite(rewards["avg"])).sum())
        return metrics

    @property
    def group_size_local(self) -> int:
        return min(self.cfg.num_generations, self.cfg.batch_size)

    def _write_rollout_media(self, items: List[PromptItem], seeds: List[int], videos: torch.Tensor,
                             rewards: Dict[str, torch.Tensor], advantages: torch.Tensor) -> None:
        cfg = self.cfg
        if not (cfg.save_rollout_videos and self.is_main):
            return
        step_dir = self.run_dir / "rl_samples" / f"{self.update_steps:07d}"
        group = self.cfg.num_generations if self.ranks_per_group == 1 else cfg.batch_size
        groups_per_rank = max(cfg.batch_size // cfg.num_generations, 1)
        for first in range(0, len(items), group):
            group_index = (self.dp_rank * groups_per_rank + first // group if self.ranks_per_group == 1
                           else self.dp_rank // self.ranks_per_group)
            group_dir = step_dir / f"group_{group_index}"
            group_dir.mkdir(parents=True, exist_ok=True)
            records = []
            for slot in range(first, min(first + group, len(items))):
                item = items[slot]
                name = (f"index_{item.index}_seed_{seeds[slot]}_dp_{self.dp_rank}_rank_{self.dp_rank}"
                        f"_sample_{slot - first}_slot_{slot}.mp4")
                write_video(group_dir / name, videos[slot], cfg.video_fps)
                record = {"prompt": item.prompt, "seed": seeds[slot], "video_path": str(group_dir / name),
                          "sample_idx": slot, "ranks_per_group": self.ranks_per_group,
                          "advantage": float(advantages[slot])}
                record.update({k: float(v[slot]) for k, v in rewards.items()})
                records.append(record)
            path = group_dir / f"index_{items[first].index}_group_{group_index}_rewards.json"
            path.write_text(json.dumps(records, indent=2))
        prune_rollout_media(self.run_dir, cfg.keep_rollout_steps)

    # ------------------------------------------------------------------ validation
    def _validation_items(self) -> List[PromptItem]:
        cfg = self.cfg
        if cfg.valid_video_csv:
            items = read_prompt_csvs(cfg.valid_video_csv)
            return [PromptItem(i.index, i.prompt, i.seed if i.seed is not None else cfg.validation_global_seed)
                    for i in items]
        prompts = cfg.validation_prompts or [DEFAULT_VALIDATION_PROMPT]
        return [PromptItem(i, p, cfg.validation_global_seed) for i, p in enumerate(prompts)]

    @torch.no_grad()
    def validate(self, step: int) -> None:
        """Deterministic (ODE) samples of the validation prompts, written to samples/step_{step:06d}/."""
        cfg = self.cfg
        size = parse_size(cfg.validation_fixed_size, "--validation_fixed_size") or (self.height, self.width)
        out_dir = self.run_dir / "samples" / f"step_{step:06d}"
        out_dir.mkdir(parents=True, exist_ok=True)
        self.models.policy.eval()
        sigmas = sde.shifted_sigmas(cfg.validation_num_inference_steps, cfg.validation_timestep_shift)
        for number, item in enumerate(self.validation_items):
            embeds = self.models.encode([item.prompt])
            video = self.models.rollout(embeds, seeds=[item.seed], sigmas=sigmas, sde_generators=None,
                                        height=size[0], width=size[1], num_frames=cfg.validate_video_length,
                                        deterministic=True).videos[0]
            name = f"sample_{number:03d}_seed_{item.seed}_{sanitize_name(item.prompt)}.mp4"
            write_video(out_dir / name, video, cfg.video_fps)
        self.models.policy.train()
        self.logger.info(f"validation videos written to {out_dir}")

    # ------------------------------------------------------------------ checkpoints
    def training_state(self) -> dict:
        return {
            "global_step": self.global_step, "update_steps": self.update_steps, "micro_steps": self.micro_steps,
            "kl_controller": self.kl_controller.state_dict() if self.kl_controller is not None else None,
            "anchor_schedule": self.anchor.state_dict(), "data": {"step": self.global_step, "seed": self.cfg.seed},
            "rng": capture_rng_state(),
        }

    def save(self) -> Path:
        if not self.is_main:
            return self.run_dir
        anchor_state = self.models.reference_state() if self.anchor.last_refreshed_at is not None else None
        path = save_checkpoint(self.run_dir, self.global_step, model_state=self.models.trainable_state_dict(),
                               optimizer_state=self.optimizer.state_dict(), training_state=self.training_state(),
                               anchor_state=anchor_state, config_yaml=(self.run_dir / "run_config.yaml").read_text()
                               if (self.run_dir / "run_config.yaml").exists() else None)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        self.logger.info(f"checkpoint saved to {path}")
        return path

    def resume(self, path: Path) -> None:
        state = load_checkpoint(path)
        self.models.load_trainable_state_dict(state["model_state"])
        self.optimizer.load_state_dict(state["optimizer_state"])
        training = state["training_state"]
        self.global_step, self.update_steps = training["global_step"], training["update_steps"]
        self.micro_steps = training["micro_steps"]
        if self.kl_controller is not None and training["kl_controller"] is not None:
            self.kl_controller.load_state_dict(training["kl_controller"])
        self.anchor.load_state_dict(training["anchor_schedule"])
        if state["anchor_state"] is not None:
            self.models.load_reference_state(state["anchor_state"])
        restore_rng_state(training["rng"])
        truncate_metrics(self.run_dir, self.global_step)
        self.logger.info(f"resumed from {path} at step {self.global_step} (update {self.update_steps})")


def run_training(cfg: TrainConfig) -> GRPOTrainer:
    trainer = GRPOTrainer(cfg)
    trainer.train()
    return trainer

"""The GRPO policy pass over one stored rollout (spec §2.9-§2.13): replay each (sample, step) pair under the policy,
PPO clipped loss times the equalizer scale of its *original* step, plus β·(KL to the reference means), one backward
per (mini-batch, trained step).

Everything the pass depends on is decided once, when the trainer builds a :class:`PolicyPass`: the sampler (kernel,
η, schedule), the KL mode, the KL controller (β a device tensor for the whole run), the equalizer scales and the
number of trained steps. The trainer keeps the seeded shuffles, the accumulation counters and the optimizer step.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from tqdm.auto import tqdm

from sage_grpo import rl
from sage_grpo.config import TrainConfig
from sage_grpo.distributed import ParallelDims, gradient_sync, mean_tensor_over_world
from sage_grpo.faults import fault_point
from sage_grpo.models.bundle import ModelBundle
from sage_grpo.pipeline.sampler import Sampler


@dataclass(frozen=True)
class PolicyPass:
    cfg: TrainConfig
    sampler: Sampler
    models: ModelBundle
    dims: ParallelDims
    device: torch.device
    kl_mode: rl.KLMode
    kl_controller: Optional[rl.AdaptiveKLController]  # None without a KL reference
    eq_scales: Optional[torch.Tensor]  # (N,) equalizer scales; None with --use_grad_balancing off
    num_train_steps: int  # steps trained per sample (--timestep_fraction of the N steps)
    show_bar: bool = False  # a tqdm bar over the backward passes (main process on a terminal, no --quiet)
    window_equalizer: bool = False  # --sde_window_equalizer window with a window on: scales renormalised over it

    def backward(self, rollout, embeds, advantages: torch.Tensor, ref_means: Optional[torch.Tensor],
                 shuffle: torch.Tensor, order: torch.Tensor, closes_window: bool, step: int,
                 rollout_weights: bool = True) -> Dict[str, float]:
        """Accumulate the gradients of one rollout batch: ``shuffle`` (B,) orders the samples, ``order`` (B, S) each
        sample's trained steps; ``closes_window``: this batch is the last of an accumulation window;
        ``rollout_weights``: no optimizer update since the rollout (the step-wise KL's π_prev is then the rollout's
        policy, else the current one, ``rl.kl``). Returns the means of the per-backward metrics (β: its last value),
        with one device-to-host copy."""
        cfg = self.cfg
        eq_scales = self.eq_scales
        if eq_scales is not None and self.window_equalizer:  # every row of order holds the window's steps
            eq_scales = rl.window_scales(eq_scales, order[0])
        stepwise_from_rollout = rollout_weights or self.kl_mode.stepwise_to_rollout
        batch, micro = rollout.latents.shape[0], cfg.mini_batch_size_per_update
        # One backward per (mini-batch, trained step); dividing by the number of backward passes of the whole
        # accumulation window makes the update the mean over samples and steps (reference GA = B * N for mb = 1).
        num_backward = self.num_train_steps * (batch // micro)
        backward_per_update = cfg.gradient_accumulation_steps * num_backward
        backward_done = 0
        history: Dict[str, List[torch.Tensor]] = {}  # per-backward metrics, kept on the device until the end
        policy = self.models.policy
        policy.train()
        bar = tqdm(total=num_backward, desc="policy update", leave=False, disable=not self.show_bar)
        for start in range(0, batch, micro):
            rows = shuffle[start:start + micro]
            sub_embeds = embeds.select(rows.tolist())
            for position in range(self.num_train_steps):
                steps = order[rows, position]                         # (mb,) original step index k
                index = steps.to(self.device)
                x = rollout.latents[rows, steps].to(self.device)             # only the rows this pass uses
                x_next = rollout.latents[rows, steps + 1].to(self.device)
                out = self.sampler.replay(policy, x, x_next, index, sub_embeds)
                old_lp = rollout.log_probs[rows, steps].to(self.device)
                scale = eq_scales[steps].to(self.device) if eq_scales is not None else None
                policy_loss, metrics = rl.ppo_clipped_loss(out.log_prob, old_lp, advantages[rows].to(self.device),
                                                           cfg.clip_range, cfg.adv_clip_max, scale)
                loss = policy_loss
                if self.kl_controller is not None and ref_means is not None:
                    beta = self.kl_controller.kl_coef  # a device tensor for the whole run (decided at setup)
                    ref_mean = ref_means[rows, steps].to(self.device)
                    previous_lp = old_lp if stepwise_from_rollout else out.log_prob.detach()
                    effective_kl, parts = rl.dual_kl(out.mean, ref_mean, out.std, previous_lp, out.log_prob,
                                                     self.kl_mode.dual, cfg.dual_kl_moving_weight,
                                                     cfg.dual_kl_step_weight)
                    # the world mean, so that every rank's controller follows the same beta; kept on the device
                    self.kl_controller.update(mean_tensor_over_world(effective_kl.detach().to(torch.float64)))
                    loss = policy_loss + beta.to(effective_kl.dtype) * effective_kl
                    metrics.update(kl_loss=effective_kl.detach(), KL_weight=beta, **parts)
                metrics["total_loss"] = loss.detach()
                backward_done += 1
                # FSDP reduces the gradients after every backward (--gradient_reduction per_backward) or once per
                # optimizer update, on the window's last backward (per_update)
                reduce_now = (self.models.placement.reduce_per_backward
                              or (closes_window and backward_done == num_backward))
                with gradient_sync(policy, enabled=reduce_now):
                    (loss / backward_per_update).backward()
                fault_point("update", step + 1)
                bar.update()
                for name, value in metrics.items():
                    history.setdefault(name, []).append(torch.as_tensor(value, dtype=torch.float64,
                                                                        device=self.device).detach())
        bar.close()
        # one device-to-host copy per step for every metric of every backward (means; β: its last value)
        summary = torch.stack([values[-1] if name == "KL_weight" else torch.stack(values).mean()
                               for name, values in history.items()])
        return dict(zip(history, summary.tolist()))

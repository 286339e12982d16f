"""The GRPO policy pass over one stored rollout (docs/reference.md#reference-means to
docs/reference.md#the-kl-terms-and-the-controller): replay each (sample, step) pair under the policy, PPO clipped loss
times the equalizer scale of its *original* step, plus β·(KL to the reference means), one backward per (mini-batch,
trained step) as the reference, or per (mini-batch, group of its samples' next trained steps).

Grouped replay (``--replay_group_size g``, the memory plan's choice, :class:`~sage_grpo.models.placement.Placement`):
g consecutive positions of the mini-batch's step orders go through one forward and one backward, g·mb rows. Each
position's terms are the reference's (its PPO mean over the mini-batch, its KL, its β), summed over the group and
divided by the same count of (mini-batch, step) iterations, so the update is the same mean over (sample, step) pairs
within float order (one forward of g·mb rows sums in another order than g forwards of mb). The adaptive β keeps the
reference's cadence, one controller update per (mini-batch, step) iteration in the same order: the group's KL values
are all known after its forward (the weights do not move inside an accumulation window), so position j's β is read
after the updates of positions < j, as in g separate iterations; only their all-reduce is one collective per group.

Everything the pass depends on is decided once, when the trainer builds a :class:`PolicyPass`: the sampler (kernel,
η, schedule), the KL mode, the KL controller (β a device tensor for the whole run), the equalizer scales and the
number of trained steps. The trainer keeps the seeded shuffles, the accumulation counters and the optimizer step.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from tqdm.auto import tqdm

from sage_grpo import rl
from sage_grpo.config.train.objective import TrustRegionConfig, UpdateConfig
from sage_grpo.distributed import gradient_sync, mean_tensor_over_world
from sage_grpo.faults import fault_point
from sage_grpo.models.bundle import ModelBundle
from sage_grpo.pipeline.sampler import Sampler


@dataclass(frozen=True)
class PolicyPass:
    update: UpdateConfig  # the configuration's update section: --clip_range, --adv_clip_max
    trust_region: TrustRegionConfig  # --dual_kl_moving_weight, --dual_kl_step_weight
    mini_batch_size: int  # --mini_batch_size_per_update
    accumulation_steps: int  # --gradient_accumulation_steps: rollout batches per optimizer update
    sampler: Sampler
    models: ModelBundle
    kl_mode: rl.KLMode
    kl_controller: Optional[rl.KLController]  # None without a KL reference
    eq_scales: Optional[torch.Tensor]  # (N,) equalizer scales; None with --use_grad_balancing off
    num_train_steps: int  # steps trained per sample (--timestep_fraction of the N steps)
    show_bar: bool = False  # a tqdm bar over the backward passes (main process on a terminal, no --quiet)
    window_equalizer: bool = False  # --sde_window_equalizer window with a window on: scales renormalised over it

    @property
    def device(self) -> torch.device:
        return self.models.device

    def backward(self, rollout, embeds, advantages: torch.Tensor, ref_means: Optional[torch.Tensor],
                 shuffle: torch.Tensor, order: torch.Tensor, closes_window: bool, step: int,
                 rollout_weights: bool = True) -> Dict[str, float]:
        """Accumulate the gradients of one rollout batch: ``shuffle`` (B,) orders the samples, ``order`` (B, S) each
        sample's trained steps; ``closes_window``: this batch is the last of an accumulation window;
        ``rollout_weights``: no optimizer update since the rollout (the step-wise KL's π_prev is then the rollout's
        policy, else the current one, ``rl.kl``). Returns the means of the per-iteration metrics (β: its last value),
        with one device-to-host copy."""
        eq_scales = self.eq_scales
        if eq_scales is not None and self.window_equalizer:  # every row of order holds the window's steps
            eq_scales = rl.window_scales(eq_scales, order[0])
        stepwise_from_rollout = rollout_weights or self.kl_mode.stepwise_to_rollout
        batch, micro = rollout.latents.shape[0], self.mini_batch_size
        group = self.models.placement.replay_group_size  # trained steps per forward and backward
        # One iteration per (mini-batch, trained step); dividing by the number of iterations of the whole
        # accumulation window makes the update the mean over samples and steps (reference GA = B * N for mb = 1).
        num_iterations = self.num_train_steps * (batch // micro)
        iterations_per_update = self.accumulation_steps * num_iterations
        iterations_done = 0
        history: Dict[str, List[torch.Tensor]] = {}  # per-iteration metrics, kept on the device until the end
        policy = self.models.policy
        policy.train()
        bar = tqdm(total=num_iterations, desc="policy update", leave=False, disable=not self.show_bar)
        for start in range(0, batch, micro):
            rows = shuffle[start:start + micro]
            for first in range(0, self.num_train_steps, group):
                positions = range(first, min(first + group, self.num_train_steps))
                loss = self._group_loss(rollout, embeds, advantages, ref_means, rows, order[rows][:, positions],
                                        history, eq_scales, stepwise_from_rollout)
                iterations_done += len(positions)
                # FSDP reduces the gradients after every backward (--gradient_reduction per_backward) or once per
                # optimizer update, on the window's last backward (per_update)
                reduce_now = (self.models.placement.reduce_per_backward
                              or (closes_window and iterations_done == num_iterations))
                with gradient_sync(policy, enabled=reduce_now):
                    (loss / iterations_per_update).backward()
                fault_point("update", step + 1)
                bar.update(len(positions))
        bar.close()
        # one device-to-host copy per step for every metric of every iteration (means; β: its last value)
        summary = torch.stack([values[-1] if name == "KL_weight" else torch.stack(values).mean()
                               for name, values in history.items()])
        return dict(zip(history, summary.tolist()))

    def _group_loss(self, rollout, embeds, advantages: torch.Tensor, ref_means: Optional[torch.Tensor],
                    rows: torch.Tensor, steps: torch.Tensor, history: Dict[str, List[torch.Tensor]],
                    eq_scales: Optional[torch.Tensor], stepwise_from_rollout: bool) -> torch.Tensor:
        """The summed loss of the (mb, g) pairs of ``rows`` (mb,) at the original ``steps`` (mb, g), replayed in one
        forward of g·mb rows (position-major); each position's metrics are appended to ``history``. ``eq_scales``:
        the equalizer's (N,) scales or None; ``stepwise_from_rollout``: the step-wise KL's π_prev is the rollout's
        log-probability (else the current policy's, detached)."""
        micro, group = rows.numel(), steps.shape[1]
        pair_rows, pair_steps = rows.repeat(group), steps.T.reshape(-1)  # (g·mb,): position j is rows j·mb..
        x = rollout.latents[pair_rows, pair_steps].to(self.device)  # only the rows this pass uses
        x_next = rollout.latents[pair_rows, pair_steps + 1].to(self.device)
        out = self.sampler.replay(self.models.policy, x, x_next, pair_steps.to(self.device),
                                  embeds.select(pair_rows.tolist()))
        old_lp = rollout.log_probs[pair_rows, pair_steps].to(self.device)
        scale = eq_scales[pair_steps].to(self.device) if eq_scales is not None else None
        previous_lp = old_lp if stepwise_from_rollout else out.log_prob.detach()
        terms = []  # per position: (policy loss, its metrics, effective KL or None)
        for j in range(group):
            part = slice(j * micro, (j + 1) * micro)
            policy_loss, metrics = rl.ppo_clipped_loss(out.log_prob[part], old_lp[part],
                                                       advantages[rows].to(self.device), self.update.clip_range,
                                                       self.update.adv_clip_max, None if scale is None else scale[part])
            effective_kl = None
            if self.kl_controller is not None and ref_means is not None:
                ref_mean = ref_means[pair_rows[part], pair_steps[part]].to(self.device)
                std = out.std[part] if out.std.ndim else out.std
                effective_kl, parts = rl.dual_kl(out.mean[part], ref_mean, std, previous_lp[part], out.log_prob[part],
                                                 self.kl_mode.dual, self.trust_region.dual_kl_moving_weight,
                                                 self.trust_region.dual_kl_step_weight)
                metrics.update(kl_loss=effective_kl.detach(), **parts)
            terms.append((policy_loss, metrics, effective_kl))
        if terms[0][2] is not None:
            # the world means, so that every rank's controller follows the same beta; kept on the device
            world_kl = mean_tensor_over_world(torch.stack([kl.detach().to(torch.float64) for _, _, kl in terms]))
        loss = None
        for j, (policy_loss, metrics, effective_kl) in enumerate(terms):
            if effective_kl is not None:
                beta = self.kl_controller.kl_coef  # a device tensor for the whole run; read before this update
                self.kl_controller.update(world_kl[j])
                policy_loss = policy_loss + beta.to(effective_kl.dtype) * effective_kl
                metrics["KL_weight"] = beta
            metrics["total_loss"] = policy_loss.detach()
            loss = policy_loss if loss is None else loss + policy_loss
            for name, value in metrics.items():
                history.setdefault(name, []).append(torch.as_tensor(value, dtype=torch.float64,
                                                                    device=self.device).detach())
        return loss

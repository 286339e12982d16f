"""The drift proxies of :mod:`sage_grpo.rl.drift` on real models (the base transformer's velocity as the callable
the pure functions take, the path KL along a stored trajectory through the sampler's own replay), the validation
metric the trainer logs (:class:`DriftProxyMetric`, a proxy of the table :mod:`.drift_proxies`) and the drift guard's
actions (:class:`DriftSentinel`).

The base model's velocity for the denoising error is its *conditional* velocity (no classifier-free guidance): the
denoiser of the data distribution the base model learnt, and one forward per level instead of two.
"""

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from sage_grpo.config.validation import ConfigError
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.drift_proxies import DEFAULT_DRIFT_PROXY, drift_proxy
from sage_grpo.pipeline.validation import PREFIX as VALIDATION_PREFIX, SPREAD_PREFIX
from sage_grpo.pipeline.velocity import cfg_velocity
from sage_grpo.rewards.scorers import MetricPlan, held_out_key_test
from sage_grpo.rl.drift import VelocityFn, denoising_errors, gaussian_path_kl, proxy_noise
from sage_grpo.rl.drift_guard import DriftGuard, DriftWatch
from sage_grpo.rl.drift_rules import ALARM, Finding
from sage_grpo.sde.schedule import NUM_TRAIN_TIMESTEPS


def conditional_velocity(transformer, embeds: PromptEmbeds, sampler) -> VelocityFn:
    """v(x_σ, σ) of ``transformer`` on ``embeds`` (one row per sample of x), unguided, at timestep 1000·σ, in the
    ``sampler``'s autocast dtype and image tokens. A mean-flow transformer gets its second timestep equal to the
    first: its average velocity over an empty interval, the instantaneous velocity the denoiser x̂0 = x − σ·v
    needs."""

    def velocity(latents: Tensor, sigma: float) -> Tensor:
        timesteps = torch.full((latents.shape[0],), NUM_TRAIN_TIMESTEPS * sigma, dtype=torch.float32)
        return cfg_velocity(transformer, latents, timesteps, embeds, 1.0, autocast_dtype=sampler.autocast_dtype,
                            num_image_tokens=sampler.num_image_tokens, timesteps_r=timesteps)

    return velocity


@torch.no_grad()
def base_denoising_errors(base, sampler, latents: Tensor, embeds: PromptEmbeds, seeds: Sequence[int],
                          sigmas: Sequence[float]) -> Tensor:
    """(B, L) denoising errors (:func:`~sage_grpo.rl.drift.denoising_errors`) of final latents (B, C, T, h, w) under
    the ``base`` transformer, ε drawn from each sample's ``seeds`` entry."""
    noise = proxy_noise(seeds, len(sigmas), latents.shape[1:])
    return denoising_errors(conditional_velocity(base, embeds, sampler), latents, sigmas, noise)


@torch.no_grad()
def trajectory_path_kl(policy, base, sampler, trajectory: Tensor, embeds: PromptEmbeds) -> Tensor:
    """(B,) path KL (:func:`~sage_grpo.rl.drift.gaussian_path_kl`) between ``policy`` and ``base`` under the
    ``sampler``'s SDE along stored latents (B, N+1, C, T, h, w) of the sampler's schedule."""
    means, base_means, stds = [], [], []
    for k in range(trajectory.shape[1] - 1):
        x, x_next = trajectory[:, k], trajectory[:, k + 1]
        mine = sampler.replay(policy, x, x_next, k, embeds)
        means.append(mine.mean)
        base_means.append(sampler.replay(base, x, x_next, k, embeds).mean)
        stds.append(mine.noise_std.reshape(-1)[0])
    return gaussian_path_kl(torch.stack(means, 1), torch.stack(base_means, 1), torch.stack(stds))


class DriftProxyMetric:
    """The validation metric ``Validation/drift_proxy`` (:mod:`sage_grpo.pipeline.validation`): the mean over the
    validation samples of a drift proxy of the table (:mod:`.drift_proxies`; the default, the base model's denoising
    error of each final latent averaged over the noise levels). It runs on every rank: the base model's forwards are
    collectives under FSDP and SP, as the sampling's are."""

    name, main_only, needs_trajectories = "drift_proxy", False, False

    def __init__(self, sigmas: Sequence[float], proxy: str = DEFAULT_DRIFT_PROXY):
        self.sigmas, self.measure = tuple(sigmas), drift_proxy(proxy)

    @torch.no_grad()
    def __call__(self, samples) -> Dict[str, float]:
        errors = []
        with samples.models.base_on_device() as base:
            for sample in samples.samples:
                errors.append(self.measure(base, samples.sampler, sample.latents[:, -1], sample.embeds,
                                           [sample.item.seed], self.sigmas).mean())
        return {"drift_proxy": float(torch.stack(errors).mean())}


def check_watched_metrics(watch: DriftWatch, plan: Optional[MetricPlan]) -> None:
    """Every ``--drift_guard_heldout`` key is one the held-out ``--validation_metrics`` (``plan``) log; checked
    before any model loads (unset, or ``none``: nothing named)."""
    logged = held_out_key_test(plan)
    unknown = [key for key in watch.heldout or () if not logged(key)]
    if unknown:
        raise ConfigError(f"[drift-guard-heldout] --drift_guard_heldout {' '.join(unknown)}: not a higher-is-better key "
                          f"that the held-out metrics of --validation_metrics "
                          f"({', '.join(plan.names) if plan is not None else 'none given'}) log. Fix: name what they "
                          "log as Validation/<key> (clipscore, pickscore, VQ, Overall, a reward's <name> or "
                          "<name>_<metric>; no manifold error), or add the metric to --validation_metrics.")


class DriftGuardStop(RuntimeError):
    """``--drift_guard stop`` (or a rollback with nothing left to roll back to) ended the run; the message names the
    bounds crossed."""


DIMENSION_PREFIX = "DriftGuard/"  # DriftGuard/<dimension>: 1.0 at a validation point where the dimension fell


def watched_dimensions(watch: DriftWatch, metrics: Dict[str, float]) -> Dict[str, Tuple[float, Optional[float]]]:
    """{dimension: (its value, its spread over the validation videos or None)} of a validation point's ``metrics``:
    the ``--drift_guard_heldout`` keys, or when none are named every score of the validation videos (a key with a
    ``ValidationSpread/`` entry: each sub-reward of the training reward and each held-out metric) but ``avg`` (the
    training reward itself) and a manifold error (the toy world's truth, which a real run lacks)."""
    if watch.heldout is not None:
        names = watch.heldout
    else:
        names = [key[len(SPREAD_PREFIX):] for key in metrics if key.startswith(SPREAD_PREFIX)]
        names = [name for name in names if name != "avg" and not name.endswith("manifold_error")]
    return {name: (metrics[VALIDATION_PREFIX + name], metrics.get(SPREAD_PREFIX + name)) for name in names
            if VALIDATION_PREFIX + name in metrics}


class DriftSentinel:
    """``--drift_guard``'s actions on what :class:`~sage_grpo.rl.drift_guard.DriftGuard` decides at each validation
    point (docs/failures.md, "Drift guard"). It sees only the validation metrics, the same dict on every rank, so every
    rank decides alike, and what it does it does through the trainer's own ``save`` and ``roll_back``.

    * every finding: a ``DRIFT GUARD`` line in the log and on the console (what crossed which bound, and what a user
      can do), and the trackers' ``Validation/drift_guard_notices`` and ``Validation/drift_guard_alarms`` (how many
      at the point) and ``DriftGuard/<dimension>`` (1.0 where that dimension fell); ``run.png`` marks them;
    * ``warn``: nothing more; training goes on. A notice never does more than this, whatever the action.
    * ``stop`` (at an alarm): a checkpoint of the current step, then :class:`DriftGuardStop` naming what crossed which
      bound.
    * ``rollback`` (at an alarm): the weights, optimizer, KL controller, anchor and EMA of the newest checkpoint at or
      before the last validation point that raised neither notice nor alarm (the anchor itself is no rollback target:
      refreshed every ``--update_ref_model_step`` updates, far more often than validation, it has followed the policy
      into the drift by the time an alarm fires); the step counters go on, so the data and the noise after it are new. Rolling back
      to the same checkpoint twice, or having none, stops as ``stop`` does.
    """

    def __init__(self, watch: DriftWatch, validator, log: Callable[[str], None]):
        """``validator``: the run's :class:`~sage_grpo.pipeline.validation.Validator`, which gets the proxy's metric.
        Without the proxy (``--drift_proxy``, ``--drift_guard``) the sentinel has no guard and does nothing."""
        self.watch, self.log = watch, log
        self.guard = DriftGuard(watch.bounds) if watch.proxy else None
        if watch.proxy:
            validator.add_metric(DriftProxyMetric(watch.sigmas))

    def state_dict(self) -> Dict[str, dict]:
        """``{"drift_guard": ...}`` in a guarded run, else nothing: the trainer adds it to its counters' state, so
        every checkpoint holds it and an unguarded run's training state stays as it was."""
        return {"drift_guard": self.guard.state_dict()} if self.guard is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """The guard's state from ``state`` (a training state); absent (a checkpoint of a run without the guard):
        the guard starts afresh, its baseline the first validation point (a note says so then)."""
        if self.guard is not None and "drift_guard" in state:
            self.guard.load_state_dict(state["drift_guard"])

    def record_step(self, metrics: Dict[str, float]) -> None:
        if self.guard is not None:
            self.guard.record_reward(metrics["gathered_avg_reward_mean"])

    def observe(self, step: int, metrics: Dict[str, float]) -> Tuple[Dict[str, float], List[Finding]]:
        """(the metrics it adds to the validation row, the notices and alarms) of the validation point at ``step``."""
        if self.guard is None:
            return {}, []
        proxy = metrics.get(VALIDATION_PREFIX + "drift_proxy")
        if proxy is not None and self.guard.proxy_baseline is None and step > 0:
            self.log(f"note: the drift proxy's baseline is its value at step {step}, the first validation point of "
                     "this run (resumed from a checkpoint without one), not the base model's own samples")
        dimensions = watched_dimensions(self.watch, metrics)
        findings = self.guard.observe(step, proxy, {name: value for name, (value, _) in dimensions.items()},
                                      {name: spread for name, (_, spread) in dimensions.items() if spread is not None})
        added = {VALIDATION_PREFIX + "drift_proxy_ratio": self.guard.proxy_ratio(proxy)} if proxy is not None else {}
        if not self.watch.guarded:
            return added, []
        alarms = [finding for finding in findings if finding.level == ALARM]
        added[VALIDATION_PREFIX + "drift_guard_notices"] = float(len(findings) - len(alarms))
        added[VALIDATION_PREFIX + "drift_guard_alarms"] = float(len(alarms))
        for finding in findings:
            if finding.dimension is not None:
                added[DIMENSION_PREFIX + finding.dimension] = 1.0
            acts = f" ({self.watch.action})" if finding.level == ALARM else " notice (it acts on nothing)"
            self.log(f"DRIFT GUARD{acts} at step {step}: {finding.message}. What to do: {finding.advice}")
        return added, findings

    def act(self, step: int, findings: List[Finding], checkpoints: Callable[[], Dict[int, Path]],
            save: Callable[[], Path], roll_back: Callable[[Path], None]) -> None:
        """Carry out the action on the alarms among ``findings`` (none: nothing; a notice never acts);
        ``checkpoints()``: the run's, step -> directory."""
        alarms = [finding for finding in findings if finding.level == ALARM]
        if not alarms or self.watch.action == "warn":
            return
        crossed = "; ".join(alarm.message for alarm in alarms)
        if self.watch.action == "rollback":
            checkpoints = checkpoints()
            target = self.guard.rollback_target(checkpoints)
            if target is not None:
                self.guard.rolled_back(target)
                roll_back(checkpoints[target])
                self.log(f"DRIFT GUARD: rolled back to {checkpoints[target]} (the newest checkpoint at or before the "
                         f"last validation point that raised neither notice nor alarm, step "
                         f"{self.guard.last_clean_step}); training goes on from step {step}")
                return
            crossed += ("; nothing to roll back to (no checkpoint at or before a validation point that crossed no "
                        "bound, or the drift came back after the rollback to it)")
        path = save()
        raise DriftGuardStop(f"--drift_guard {self.watch.action} stopped the run at step {step}: {crossed}. The "
                             f"weights of this step are in {path}")

"""Drift proxies (sage_grpo.rl.drift) on hand-built velocity fields and tensors, with the expected arithmetic; the
drift guard (sage_grpo.rl.drift_guard) and its actions (sage_grpo.pipeline.drift.DriftSentinel) on hand-fed points."""
import math
from pathlib import Path

import pytest
import torch

from sage_grpo.rl.drift import (denoising_errors, energy_distance, gaussian_path_kl, paired_rms, proxy_noise,
                                spearman)
from sage_grpo.rl.drift_guard import DriftGuard, GuardBounds, drift_watch_of
from sage_grpo.rl.drift_rules import Finding


def point_mass_velocity(center: torch.Tensor):
    """The exact rectified-flow velocity of data concentrated at ``center``: x_σ = (1 − σ)·c + σ·ε, v = ε − c, so
    v = (x_σ − c)/σ and its x̂0 = x_σ − σ·v is c for every input."""
    return lambda x, sigma: (x - center) / sigma


def test_denoising_error_is_the_squared_distance_to_a_point_mass():
    center = torch.zeros(1, 2, 3)
    on = torch.zeros(1, 2, 3)
    off = torch.full((1, 2, 3), 0.5)  # x̂0 = 0, so e = mean (0 − 0.5)² = 0.25 at every level, whatever ε
    latents = torch.cat([on, off])
    noise = proxy_noise([1, 2], 3, (2, 3))
    errors = denoising_errors(point_mass_velocity(center), latents, (0.25, 0.5, 0.75), noise)
    torch.testing.assert_close(errors, torch.tensor([[0.0] * 3, [0.25] * 3]))


def test_denoising_error_sees_what_the_model_does_not_restore():
    # a model that returns the noisy input's own direction (v = ε − x0 exactly) restores everything: e = 0; one that
    # predicts v = 0 leaves x̂0 = x_σ, so e = mean ((1 − σ)x0 + σε − x0)² = σ² mean (ε − x0)²
    latents = torch.tensor([[1.0, -1.0]])
    noise = torch.tensor([[[0.5, 0.5]]])  # (L=1, B=1, 2)
    zero = denoising_errors(lambda x, s: torch.zeros_like(x), latents, (0.5,), noise)
    # σ² mean((0.5 − 1)², (0.5 + 1)²) = 0.25 · (0.25 + 2.25)/2 = 0.3125
    torch.testing.assert_close(zero, torch.tensor([[0.3125]]))


def test_denoising_error_refuses_bad_levels_and_noise():
    latents = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="noise .* does not match 2 levels"):
        denoising_errors(lambda x, s: x, latents, (0.2, 0.4), torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match=r"noise levels must lie in \(0, 1\), got 1.0"):
        denoising_errors(lambda x, s: x, latents, (1.0,), torch.zeros(1, 2, 3))


def test_proxy_noise_is_fixed_per_seed_and_leaves_every_other_generator_alone():
    before = torch.get_rng_state()
    first = proxy_noise([930, 931], 2, (3,))
    assert torch.equal(torch.get_rng_state(), before)  # the global generator the training may use is untouched
    assert first.shape == (2, 2, 3)
    assert torch.equal(first, proxy_noise([930, 931], 2, (3,)))  # the same ε at every validation
    assert torch.equal(first[:, 1], proxy_noise([931], 2, (3,))[:, 0])  # a sample's ε does not depend on the batch
    # not the sample's own initial noise, which the generator seeded with the seed itself draws first
    own = torch.randn((2, 3), generator=torch.Generator().manual_seed(930))
    assert not torch.allclose(first[:, 0], own)


def test_gaussian_path_kl_by_hand():
    # step 0: Δμ = 0.2 everywhere, n = 0.1 → 0.04 / (2 · 0.01) = 2; step 1: Δμ = 0 → 0; sample 2: Δμ = 0.1 at step 1
    # with n = 0.5 → 0.01 / 0.5 = 0.02
    means = torch.zeros(2, 2, 4)
    base = torch.zeros(2, 2, 4)
    means[0, 0] = 0.2
    means[1, 1] = 0.1
    kl = gaussian_path_kl(means, base, torch.tensor([0.1, 0.5]))
    torch.testing.assert_close(kl, torch.tensor([2.0, 0.02]))
    with pytest.raises(ValueError, match="disagree"):
        gaussian_path_kl(means, base, torch.tensor([0.1]))


def test_paired_rms_and_energy_distance_by_hand():
    x = torch.zeros(2, 4)
    y = torch.full((2, 4), 0.5)
    torch.testing.assert_close(paired_rms(x, y), torch.tensor([0.5, 0.5]))
    # |x − y| = sqrt(4 · 0.25) = 1, per-element scale sqrt(4) = 2: 2 · 0.5 − 0 − 0 = 1
    torch.testing.assert_close(energy_distance(x, y), torch.tensor(1.0))
    assert float(energy_distance(x, x)) == 0.0
    with pytest.raises(ValueError, match="differ"):
        paired_rms(x, y[:1])


def test_spearman_by_hand():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties: ranks [1.5, 1.5, 3] vs [1, 2, 3]; centred [-.5, -.5, 1] · [-1, 0, 1] = 1.5 over sqrt(1.5)·sqrt(2)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    with pytest.raises(ValueError, match="same length"):
        spearman([1, 2], [1])


# ------------------------------------------------------------------------------------------- the sentinel

BOUNDS = GuardBounds(proxy_ratio=2.0, window=3, reward_rise=0.0, heldout_fall=0.05)


def feed(guard, step, rewards, proxy=None, heldout=None):
    for reward in rewards:
        guard.record_reward(reward)
    return guard.observe(step, proxy, heldout or {})


def test_proxy_bound_is_a_ratio_to_the_first_point():
    guard = DriftGuard(BOUNDS)
    assert feed(guard, 0, [], proxy=0.01) == []  # the step-0 point: the base model's samples, the baseline
    assert feed(guard, 2, [0.4, 0.5], proxy=0.012) == []  # 1.2x, and at that growth 1.73x two points on
    assert guard.last_clean_step == 2
    alarms = feed(guard, 4, [0.6], proxy=0.025)
    assert alarms == [Finding(4, "proxy", "drift proxy 0.025 is 2.50x its baseline 0.01 (bound "
                                        "--drift_guard_proxy_ratio 2)")]
    assert guard.last_clean_step == 2


def test_reward_rising_while_heldout_falls_below_its_start():
    guard = DriftGuard(BOUNDS)
    feed(guard, 0, [], heldout={"adherence": 0.65})
    assert feed(guard, 2, [0.4], heldout={"adherence": 0.65}) == []
    assert feed(guard, 4, [0.6], heldout={"adherence": 0.6}) == []  # two points: no window yet
    # the window's means: rewards (0.4 + 0.6 + 0.8) / 3 = 0.6 against the first step's 0.4; adherence (0.65 + 0.6 +
    # 0.5) / 3 = 0.5833, 0.0667 below its first 0.65; bound 0.05 x |0.65| = 0.0325 (no spread given)
    alarms = feed(guard, 6, [0.7, 0.9], heldout={"adherence": 0.5})
    assert [a.check for a in alarms] == ["reward_vs_heldout"] and alarms[0].dimension == "adherence"
    assert alarms[0].message == ("over the validation points of steps 2-6 the training reward rose by 0.2 from the "
                                 "first step's 0.4 (bound --drift_guard_reward_rise 0) while adherence averaged "
                                 "0.5833, 0.06667 below its 0.65 at the first validation point; above "
                                 "--drift_guard_heldout_fall 0.05 x |0.65| = 0.0325")
    # the held-out metric back above its start over the window, or the reward back at its start, ends it
    assert [len(feed(guard, s, [0.9], heldout={"adherence": 0.7})) for s in (8, 10, 12)] == [1, 0, 0]
    assert feed(guard, 14, [0.4], heldout={"adherence": 0.5}) == []  # rewards 0.9, 0.9, 0.4: still up 0.33...
    assert [a.dimension for a in feed(guard, 16, [0.4], heldout={"adherence": 0.5})] == ["adherence"]
    assert feed(guard, 18, [0.0], heldout={"adherence": 0.5}) == []  # rewards 0.4, 0.4, 0.0: below the start


def test_a_failed_reward_step_and_a_flat_reward_raise_nothing():
    guard = DriftGuard(BOUNDS)
    feed(guard, 0, [], heldout={"m": 1.0})
    for step, value in ((2, 0.9), (4, 0.8), (6, 0.7)):
        assert feed(guard, step, [0.5, float("nan")], heldout={"m": value}) == []  # reward flat at 0.5
    assert guard.points[-1]["reward"] == 0.5


def test_guard_state_resumes_exactly():
    points = [(0, [], 0.01, {"m": 0.65}), (2, [0.4], 0.012, {"m": 0.65}), (4, [0.6], 0.015, {"m": 0.6}),
              (6, [0.8, 0.8], 0.03, {"m": 0.5})]
    whole = DriftGuard(BOUNDS)
    expected = [feed(whole, *point) for point in points]
    first = DriftGuard(BOUNDS)
    for point in points[:2]:
        feed(first, *point)
    first.record_reward(0.6)  # a step after the point, before the checkpoint
    state = first.state_dict()
    resumed = DriftGuard(BOUNDS)
    resumed.load_state_dict(state)
    assert feed(resumed, 4, [], 0.015, {"m": 0.6}) == expected[2]
    assert feed(resumed, *points[3]) == expected[3] and len(expected[3]) == 2
    assert resumed.state_dict() == whole.state_dict()
    state["points"][0]["heldout"]["m"] = -1.0  # the saved state is a copy, not the guard's own lists
    assert resumed.points[0]["heldout"]["m"] != -1.0
    with pytest.raises(ValueError, match="at least 2 validation points, got 1"):
        DriftGuard(GuardBounds(2.0, 1, 0.0, 0.05))


def test_a_saved_guard_state_is_checked_before_it_is_used():
    state = DriftGuard(BOUNDS).state_dict()
    guard = DriftGuard(BOUNDS)
    guard.load_state_dict(state)
    with pytest.raises(ValueError, match=r"must hold exactly \['heldout_baseline', 'last_clean_step'"):
        guard.load_state_dict({**state, "extra": 1})
    with pytest.raises(ValueError, match="the drift guard state's points must be a list of validation points, got "
                                         r"\[\{'step': '2'"):
        guard.load_state_dict({**state, "points": [{"step": "2", "reward": 0.5, "heldout": {}}]})
    with pytest.raises(ValueError, match="proxy_baseline must be a number or None, got True"):
        guard.load_state_dict({**state, "proxy_baseline": True})


# ------------------------------------------------------------------------------------------- the sentinel's actions

class Validator:
    """Records the metrics a sentinel registers."""

    def __init__(self):
        self.metrics = []

    def add_metric(self, metric):
        self.metrics.append(metric)


def sentinel(action: str, **flags):
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.pipeline.drift import DriftSentinel
    from sage_grpo.rl import NO_KL

    cfg = TrainConfig.of(drift_guard=action, drift_guard_proxy_ratio=2.0, **flags)
    log = []
    return DriftSentinel(drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, NO_KL), Validator(), log.append), log


class Run:
    """What the trainer hands to DriftSentinel.act: its checkpoints, save and roll_back, recorded."""

    def __init__(self, steps):
        self.checkpoints = {s: Path(f"run/checkpoint-{s}") for s in steps}
        self.calls = []

    def act(self, sentinel, step, alarms):
        sentinel.act(step, alarms, lambda: self.checkpoints, lambda: self.calls.append(("save", step)) or
                     Path(f"run/checkpoint-{step}"), lambda path: self.calls.append(("roll_back", path)))


def points(sentinel, run, values):
    """Validation points at steps 0, 2, 4, ... with these proxy values, one training step of reward 0.5 before each
    but the first; acted on as the trainer does."""
    for index, value in enumerate(values):
        if index:
            sentinel.record_step({"gathered_avg_reward_mean": 0.5})
        added, alarms = sentinel.observe(2 * index, {"Validation/drift_proxy": value})
        run.act(sentinel, 2 * index, alarms)
    return added


def test_warn_logs_and_reports_the_alarm_and_goes_on():
    guard, log = sentinel("warn")
    run = Run([2])
    added = points(guard, run, [0.1, 0.15, 0.25])
    assert added == {"Validation/drift_proxy_ratio": pytest.approx(2.5), "Validation/drift_guard_notices": 0.0,
                     "Validation/drift_guard_alarms": 1.0}
    assert log == [("DRIFT GUARD (warn) at step 4: drift proxy 0.25 is 2.50x its baseline 0.1 (bound "
                      "--drift_guard_proxy_ratio 2). What to do: the samples are leaving what the base model knows: "
                      "lower --learning_rate, raise --kl_weight (beta), refresh the KL anchor less often (a larger "
                      "--update_ref_model_step), or go back to an earlier checkpoint (--drift_guard rollback does it "
                      "at an alarm)")]
    assert run.calls == []


def test_stop_saves_then_names_the_bound():
    from sage_grpo.pipeline.drift import DriftGuardStop

    guard, _ = sentinel("stop")
    run = Run([2])
    with pytest.raises(DriftGuardStop) as stopped:
        points(guard, run, [0.1, 0.15, 0.25])
    assert str(stopped.value) == ("--drift_guard stop stopped the run at step 4: drift proxy 0.25 is 2.50x its "
                                  "baseline 0.1 (bound --drift_guard_proxy_ratio 2). The weights of this step are in "
                                  "run/checkpoint-4")
    assert run.calls == [("save", 4)]


def test_rollback_goes_to_the_newest_clean_checkpoint_once_then_stops():
    from sage_grpo.pipeline.drift import DriftGuardStop

    guard, log = sentinel("rollback")
    run = Run([2, 4, 6])  # checkpoint-6 was written after the last clean point (step 4): not a target
    points(guard, run, [0.1, 0.15, 0.18, 0.3])
    assert run.calls == [("roll_back", Path("run/checkpoint-4"))]
    assert log[-1] == ("DRIFT GUARD: rolled back to run/checkpoint-4 (the newest checkpoint at or before the last "
                       "validation point that raised neither notice nor alarm, step 4); training goes on from step 6")
    assert guard.guard.rollbacks == [4]
    guard.record_step({"gathered_avg_reward_mean": 0.5})
    _, alarms = guard.observe(8, {"Validation/drift_proxy": 0.35})
    with pytest.raises(DriftGuardStop, match="at step 8: drift proxy 0.35 is 3.50x its baseline 0.1 .*; nothing to "
                                             "roll back to"):
        run.act(guard, 8, alarms)
    assert run.calls[-1] == ("save", 8)


def test_without_the_proxy_the_sentinel_does_nothing_and_saves_no_state():
    guard, log = sentinel("off")
    assert guard.guard is None and guard.state_dict() == {}
    guard.record_step({"gathered_avg_reward_mean": 0.5})
    assert guard.observe(2, {"Validation/avg": 0.5}) == ({}, [])
    guard.load_state_dict({"global_step": 2, "drift_guard": {}})  # a guarded run's state, resumed unguarded: ignored


def test_the_sentinel_registers_the_proxy_and_resumes_its_guard():
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.pipeline.drift import DriftProxyMetric, DriftSentinel
    from sage_grpo.rl import NO_KL

    validator = Validator()
    cfg = TrainConfig.of(drift_proxy=True, drift_proxy_sigmas=[0.5])
    watch = drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, NO_KL)
    first = DriftSentinel(watch, validator, [].append)
    assert [type(m) for m in validator.metrics] == [DriftProxyMetric] and validator.metrics[0].sigmas == (0.5,)
    first.observe(0, {"Validation/drift_proxy": 0.2})
    log = []
    resumed = DriftSentinel(watch, Validator(), log.append)
    resumed.load_state_dict({"global_step": 0, **first.state_dict()})
    assert resumed.guard.proxy_baseline == 0.2
    fresh = DriftSentinel(watch, Validator(), log.append)
    fresh.load_state_dict({"global_step": 4})  # a checkpoint of a run without the guard
    assert fresh.observe(6, {"Validation/drift_proxy": 0.3})[0] == {"Validation/drift_proxy_ratio": 1.0}
    assert log == ["note: the drift proxy's baseline is its value at step 6, the first validation point of this run "
                   "(resumed from a checkpoint without one), not the base model's own samples"]


def test_the_guard_watches_the_held_out_keys_it_is_given_and_they_are_checked_before_any_model():
    from sage_grpo.config.validation import ConfigError
    from sage_grpo.pipeline.drift import check_watched_metrics
    from sage_grpo.rewards.scorers import MetricPlan

    guard, log = sentinel("warn", drift_guard_heldout=["clipscore", "toy_red_prompt_adherence"])
    metrics = {"Validation/drift_proxy": 0.1, "Validation/avg": 0.2, "Validation/clipscore": 0.3,
               "Validation/pickscore": 20.0, "Validation/toy_red_prompt_adherence": 0.6,
               "Validation/sampling_time": 3.0}
    guard.observe(0, metrics)
    assert guard.guard.heldout_baseline == {"clipscore": 0.3, "toy_red_prompt_adherence": 0.6}
    plan = MetricPlan(("clipscore", "toy_red"), {})
    check_watched_metrics(guard.watch, plan)  # both are keys the held-out metrics log
    for keys, names in ((["clip_score"], "clipscore, toy_red"), (["toy_red_manifold_error"], "clipscore, toy_red")):
        bad, _ = sentinel("warn", drift_guard_heldout=keys)
        with pytest.raises(ConfigError, match=rf"^\[drift-guard-heldout\] --drift_guard_heldout {keys[0]}: not a "
                                              rf"higher-is-better key that the held-out metrics of "
                                              rf"--validation_metrics \({names}\) log\. Fix: "):
            check_watched_metrics(bad.watch, plan)
    with pytest.raises(ConfigError, match=r"--validation_metrics \(none given\)"):
        check_watched_metrics(guard.watch, None)


def test_the_drift_flags_are_checked_and_decided_once():
    from sage_grpo.config import validate_train_config
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.config.validation import ConfigError
    from sage_grpo.rl import kl_mode_of

    def check(**flags):
        validate_train_config(TrainConfig.of(sp_size=1, num_generations=2, **flags))

    assert validate_train_config(TrainConfig.of(sp_size=1, num_generations=2, drift_guard="warn",
                                             validation_interval=0)) == [
        "--drift_guard warn is measured at the validation points and --validation_interval is 0: the drift proxy and "
        "guard are off"]
    with pytest.raises(ConfigError, match=r"^\[drift-proxy-sigmas\] --drift_proxy_sigmas \[0.5, 1.0\] must be"):
        check(drift_proxy=True, drift_proxy_sigmas=[0.5, 1.0])
    with pytest.raises(ConfigError, match=r"^\[drift-guard-bounds\] --drift_guard_proxy_ratio 1 must be > 1 \(the "
                                          r"step-0 point is 1 by definition\)\. Fix: use the defaults"):
        check(drift_guard="stop", drift_guard_proxy_ratio=1.0)
    with pytest.raises(ConfigError) as refused:  # each bound out of its range named, and only those
        check(drift_guard="warn", drift_guard_notice_ratio=0.5, drift_guard_dimension_fall=-1.0)
    assert str(refused.value).startswith("[drift-guard-bounds] --drift_guard_notice_ratio 0.5 must be > 1 (the step-0 "
                                         "point is 1 by definition); --drift_guard_dimension_fall -1 must be >= 0. Fix: "
                                         "use the defaults (--drift_guard_window 3,")
    with pytest.raises(ConfigError, match=r"^\[drift-guard-heldout\] --drift_guard_heldout none clipscore: 'none' "):
        check(drift_guard="warn", drift_guard_heldout=["none", "clipscore"])
    check(drift_proxy_sigmas=[2.0], validation_interval=0)  # nothing watched: the drift flags are not read

    def watch(**flags):
        cfg = TrainConfig.of(**flags)
        return drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl_mode_of(cfg.trust_region))

    assert watch().sigmas == () and not watch().guarded and not watch().base_copy  # off by default
    assert watch(drift_guard="stop", validation_interval=0) == watch()  # nothing to watch: off
    assert watch(drift_guard="warn").sigmas == (0.5, 0.75, 0.9)  # the guard turns the proxy on
    # the frozen base costs a copy only where no model of the run is the base already
    assert watch(drift_proxy=True).base_copy  # the reference launch: the moving anchor leaves the base behind
    assert watch(drift_proxy=True, kl_weight=0.0).base_copy  # no KL: no reference at all
    assert not watch(drift_proxy=True, use_moving_KL=False).base_copy  # a fixed anchor is the base
    assert not watch(drift_proxy=True, use_lora=True).base_copy  # LoRA: the policy with its adapters disabled


def test_run_png_shows_the_proxy_beside_the_true_manifold_error():
    from sage_grpo.cli.plot import run_panels

    train = [{"step": s, "gathered_avg_reward_mean": 0.5, "gathered_toy_large_manifold_error_reward_mean": 0.07}
             for s in (1, 2, 3, 4)]
    valid = [{"step": s, "Validation/toy_large_manifold_error": error, "Validation/drift_proxy": 0.1 * ratio,
              "Validation/drift_proxy_ratio": ratio, "Validation/drift_guard_alarms": float(ratio > 2),
              "Validation/clipscore": 0.3} for s, error, ratio in ((0, 0.05, 1.0), (2, 0.06, 1.5), (4, 0.1, 2.5))]
    panels = run_panels(train + valid)
    drift = next(p for p in panels if p.title.startswith("drift of the validation samples"))
    assert [(s.name, list(s.x), [round(y, 6) for y in s.y]) for s in drift.series] == [
        ("drift proxy", [0, 2, 4], [1.0, 1.5, 2.5]), ("manifold error (truth)", [0, 2, 4], [1.0, 1.2, 2.0]),
        ("drift guard alarms", [4], [2.5])]
    assert [p.title for p in panels if p.title.startswith("held-out")] == [
        "held-out Validation/clipscore of the validation prompts (mean over the prompts)"]  # no drift key panels

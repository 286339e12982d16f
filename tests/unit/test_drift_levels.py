"""The drift guard's two levels (a notice before the alarm: a lower bound, and the proxy's growth per validation point),
its per-dimension check (every sub-reward and held-out metric watched by default, the fallen one named), and where
they are seen (the console line with what to do, the trackers' keys, run.png), on hand-fed validation points."""
import math

import pytest

from sage_grpo.rl.drift_guard import DriftGuard, GuardBounds, drift_watch_of
from sage_grpo.rl.drift_rules import ALARM, NOTICE, projected_ratio

BOUNDS = GuardBounds(proxy_ratio=4.0, window=2, reward_rise=0.0, heldout_fall=0.05, notice_ratio=2.0,
                     dimension_fall=1.0)


def levels(guard, ratios, step=2):
    """Feed proxy values of these ratios to a fresh baseline of 0.1 (one point every ``step`` steps, one training
    step of reward 0.5 before each but the first); the (level, check) of each point's findings."""
    seen = []
    for index, ratio in enumerate(ratios):
        if index:
            guard.record_reward(0.5)
        seen.append([(f.level, f.check) for f in guard.observe(index * step, 0.1 * ratio, {})])
    return seen


def test_a_notice_comes_at_the_lower_bound_before_the_alarm():
    guard = DriftGuard(BOUNDS)
    assert levels(guard, [1.0, 1.3, 1.5, 2.5, 3.0, 4.5]) == [
        [], [], [], [(NOTICE, "proxy")], [(NOTICE, "proxy")], [(ALARM, "proxy")]]
    assert guard.last_clean_step == 4  # the last point before the drift was seen coming: a rollback's target


def test_the_trend_notices_a_fast_drift_two_points_ahead():
    # 1.0 -> 1.7: at that growth per point, 1.7 x 1.7^2 = 4.91 two points on, past twice the notice bound: noticed at
    # 1.7, below the level 2
    guard = DriftGuard(BOUNDS)
    findings = [guard.observe(0, 0.1, {})]
    guard.record_reward(0.5)
    findings.append(guard.observe(2, 0.17, {}))
    assert findings[0] == [] and [f.level for f in findings[1]] == [NOTICE]
    assert findings[1][0].message == ("drift proxy 0.17 is 1.70x its baseline 0.1, up from 1.00x at the previous "
                                      "validation point: growing so, it reaches 4.91x 2 validation points on, past 4 "
                                      "(2 x --drift_guard_notice_ratio 2)")
    # a slow drift (1.0, 1.2, 1.4: 1.4 x (1.4/1.2)^2 = 1.91) and a falling proxy say nothing
    assert levels(DriftGuard(BOUNDS), [1.0, 1.2, 1.4, 1.3, 1.0]) == [[]] * 5
    assert projected_ratio(1.4, 1.2) == pytest.approx(1.4 * (1.4 / 1.2) ** 2)
    assert projected_ratio(1.2, 1.4) is None and projected_ratio(1.2, None) is None


def test_a_notice_bound_at_or_above_the_alarm_gives_no_level_notice():
    guard = DriftGuard(GuardBounds(4.0, 2, 0.0, 0.05, notice_ratio=4.0))
    # 3.5: the trend (3.5 x 3.2^2 = 35 > 2 x 4); 3.6: none (3.6 x 1.03^2 = 3.8)
    assert levels(guard, [1.0, 1.1, 3.5, 3.6]) == [[], [], [(NOTICE, "proxy")], []]


def feed_dimensions(guard, points):
    """Points (step, training rewards before it, {dimension: value}, {dimension: spread})."""
    found = []
    for step, rewards, values, spreads in points:
        for reward in rewards:
            guard.record_reward(reward)
        found.append(guard.observe(step, None, values, spreads))
    return found


MIXTURE = [  # a weighted mixture whose TA is given up for VQ and MQ; their spreads over the first videos
    (0, [], {"vq": 0.50, "mq": 0.40, "ta": 0.80}, {"vq": 0.2, "mq": 0.2, "ta": 0.1}),
    (2, [0.6, 0.7], {"vq": 0.60, "mq": 0.50, "ta": 0.72}, {"vq": 0.2, "mq": 0.2, "ta": 0.1}),
    (4, [0.8, 0.9], {"vq": 0.70, "mq": 0.55, "ta": 0.60}, {"vq": 0.2, "mq": 0.2, "ta": 0.1}),
    (6, [1.0, 1.1], {"vq": 0.75, "mq": 0.60, "ta": 0.55}, {"vq": 0.2, "mq": 0.2, "ta": 0.1}),
]


def test_the_sacrificed_dimension_is_named():
    found = feed_dimensions(DriftGuard(BOUNDS), MIXTURE)
    # step 4: the means of steps 2 and 4, ta (0.72 + 0.60) / 2 = 0.66, 0.14 below 0.80: 1.4x its spread 0.1; the
    # training reward's mean (0.65 + 0.85) / 2 = 0.75 against the first step's 0.6
    assert found[:2] == [[], []]
    assert [(f.level, f.dimension) for f in found[2]] == [(ALARM, "ta")]
    assert found[2][0].message == (
        "over the validation points of steps 2-4 the training reward rose by 0.15 from the first step's 0.6 (bound "
        "--drift_guard_reward_rise 0) while ta averaged 0.66, 0.14 below its 0.8 at the first validation point, 1.40x "
        "its spread 0.1 over the validation videos there (bound --drift_guard_dimension_fall 1); above "
        "--drift_guard_heldout_fall 0.05 x |0.8| = 0.04")
    assert [f.dimension for f in found[3]] == ["ta"]  # still down at the next point: alarmed again


def test_a_fall_within_the_spread_or_without_the_reward_rising_is_no_alarm():
    within = [(s, r, dict(v, ta=0.8 - 0.3 * (0.8 - v["ta"])), p) for s, r, v, p in MIXTURE]  # at most 0.68x
    assert feed_dimensions(DriftGuard(BOUNDS), within) == [[]] * 4
    flat = [(s, [0.6] * len(r), v, p) for s, r, v, p in MIXTURE]  # the training reward never rises
    assert feed_dimensions(DriftGuard(BOUNDS), flat) == [[]] * 4
    unspread = [(s, r, v, {}) for s, r, v, _ in MIXTURE]  # no spreads: the relative bound (5% of 0.8) alone
    assert [f.dimension for f in feed_dimensions(DriftGuard(BOUNDS), unspread)[3]] == ["ta"]


def test_every_score_of_the_validation_videos_is_watched_by_default():
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.pipeline.drift import watched_dimensions
    from sage_grpo.rl import NO_KL

    metrics = {"Validation/avg": 1.2, "Validation/videoalign_vq": 0.1, "Validation/videoalign_ta": 0.4,
               "Validation/clipscore": 0.3, "Validation/toy_large_manifold_error": 0.1, "Validation/drift_proxy": 0.2,
               "Validation/reward_time": 1.0, "ValidationSpread/avg": 0.5, "ValidationSpread/videoalign_vq": 0.05,
               "ValidationSpread/videoalign_ta": 0.2, "ValidationSpread/clipscore": 0.02,
               "ValidationSpread/toy_large_manifold_error": 0.01}

    def watch(**flags):
        cfg = TrainConfig.of(drift_guard="warn", **flags)
        return drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, NO_KL)

    assert watched_dimensions(watch(), metrics) == {"videoalign_vq": (0.1, 0.05), "videoalign_ta": (0.4, 0.2),
                                                    "clipscore": (0.3, 0.02)}
    assert watched_dimensions(watch(drift_guard_heldout=["clipscore"]), metrics) == {"clipscore": (0.3, 0.02)}
    assert watched_dimensions(watch(drift_guard_heldout=["none"]), metrics) == {}


def test_a_guard_state_saved_before_the_levels_resumes():
    guard = DriftGuard(BOUNDS)
    feed_dimensions(guard, MIXTURE[:2])
    old = {k: v for k, v in guard.state_dict().items() if k not in ("previous_ratio", "spread_baseline",
                                                                       "reward_start")}
    resumed = DriftGuard(BOUNDS)
    resumed.load_state_dict(old)
    assert resumed.spread_baseline == {} and resumed.reward_start is None and resumed.points == guard.points
    with pytest.raises(ValueError, match="the drift guard state's spread_baseline must be a mapping of metric names "
                                         "to numbers, got 'x'"):
        resumed.load_state_dict({**old, "spread_baseline": "x"})


def test_the_spread_over_the_validation_videos_by_hand():
    from sage_grpo.pipeline.validation import spread_over_videos

    spreads = spread_over_videos([{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": math.nan}, {"a": 5.0}])
    assert spreads["ValidationSpread/a"] == pytest.approx(math.sqrt(8 / 3))  # population std of 1, 3, 5
    assert math.isnan(spreads["ValidationSpread/b"])  # one finite value: no spread


def test_the_console_and_trackers_say_what_crossed_and_what_to_do_and_a_notice_never_acts():
    from pathlib import Path

    from sage_grpo.config.train import TrainConfig
    from sage_grpo.pipeline.drift import DriftSentinel
    from sage_grpo.rl import NO_KL

    cfg = TrainConfig.of(drift_guard="stop")
    log, calls = [], []
    sentinel = DriftSentinel(drift_watch_of(cfg.drift, 1, False, NO_KL), type("V", (), {"add_metric": print})(),
                             log.append)
    sentinel.observe(0, {"Validation/drift_proxy": 0.1, "Validation/ta": 0.8, "ValidationSpread/ta": 0.1})
    sentinel.record_step({"gathered_avg_reward_mean": 0.5})
    added, findings = sentinel.observe(2, {"Validation/drift_proxy": 0.25, "Validation/ta": 0.8,
                                           "ValidationSpread/ta": 0.1})
    assert added == {"Validation/drift_proxy_ratio": 2.5, "Validation/drift_guard_notices": 1.0,
                     "Validation/drift_guard_alarms": 0.0}
    assert log == ["DRIFT GUARD notice (it acts on nothing) at step 2: drift proxy 0.25 is 2.50x its baseline 0.1 "
                   "(notice bound --drift_guard_notice_ratio 2; the alarm at 8). What to do: the samples are leaving "
                   "what the base model knows: lower --learning_rate, raise --kl_weight (beta), refresh the KL anchor "
                   "less often (a larger --update_ref_model_step), or go back to an earlier checkpoint "
                   "(--drift_guard rollback does it at an alarm)"]
    sentinel.act(2, findings, lambda: {}, lambda: calls.append("save") or Path("c"), calls.append)
    assert calls == []  # --drift_guard stop: a notice saves and stops nothing


def test_run_png_marks_the_notices_the_alarms_and_the_fallen_dimension(tmp_path):
    from PIL import Image

    from sage_grpo.cli.plot import run_panels
    from sage_grpo.tracking.plots import plot_panels

    train = [{"step": s, "gathered_avg_reward_mean": 0.5, "gathered_mix_ta_reward_mean": 0.5} for s in (1, 2, 3, 4)]
    valid = [{"step": 0, "Validation/mix_ta": 0.8, "Validation/drift_proxy_ratio": 1.0,
              "Validation/drift_guard_notices": 0.0, "Validation/drift_guard_alarms": 0.0},
             {"step": 2, "Validation/mix_ta": 0.7, "Validation/drift_proxy_ratio": 2.5,
              "Validation/drift_guard_notices": 1.0, "Validation/drift_guard_alarms": 1.0, "DriftGuard/mix_ta": 1.0},
             {"step": 4, "Validation/mix_ta": 0.5, "Validation/drift_proxy_ratio": 4.5,
              "Validation/drift_guard_notices": 0.0, "Validation/drift_guard_alarms": 2.0, "DriftGuard/mix_ta": 1.0}]
    panels = run_panels(train + valid)
    drift = next(p for p in panels if p.title.startswith("drift of the validation samples"))
    # step 2: a notice of the proxy and an alarm of mix_ta (not the proxy's); step 4: both alarms
    assert [(s.name, list(s.x), list(s.y), s.points_only) for s in drift.series[1:]] == [
        ("drift guard notices", [2], [2.5], True), ("drift guard alarms", [4], [4.5], True)]
    (fell,) = [p for p in panels if "Validation/mix_ta" in p.title]
    assert fell.title == ("Validation/mix_ta of the validation prompts (mean over the prompts); marked: the drift "
                          "guard saw it fall while the reward rose")  # a sub-reward: no held-out panel otherwise
    assert [(s.name, list(s.x), list(s.y)) for s in fell.series] == [
        ("mix_ta", [0, 2, 4], [0.8, 0.7, 0.5]), ("fell (drift guard alarm)", [2, 4], [0.7, 0.5])]
    picture = Image.open(plot_panels(panels, tmp_path / "run.png"))
    assert picture.size == (900, 10 + 320 * len(panels))

"""The drift guard's study (sage_grpo.studies.guard_study, scripts/drift_guard_study.py): the guard replayed over a run's
metrics.jsonl rows and judged against the toy world's truth, on hand-built rows."""
import pytest

from sage_grpo.rl.drift_guard import GuardBounds
from sage_grpo.studies.guard_study import live_matches, outcome, replay, summary, table_row

BOUNDS = GuardBounds(proxy_ratio=8.0, window=3, reward_rise=0.0, heldout_fall=0.05, notice_ratio=2.0,
                     dimension_fall=1.0)


def rows(ratios, errors, logged=None):
    """A run validated every 2 steps: two training steps of rising reward before each point but the first; the
    points' proxy (0.1 x ratio), manifold error and the guard's logged (notices, alarms)."""
    out = []
    for index, (ratio, error) in enumerate(zip(ratios, errors)):
        if index:
            out += [{"step": 2 * index - 1, "gathered_avg_reward_mean": 0.1 * index},
                    {"step": 2 * index, "gathered_avg_reward_mean": 0.1 * index}]
        notices, alarms = (logged or {}).get(2 * index, (0.0, 0.0))
        out.append({"step": 2 * index, "Validation/drift_proxy": 0.1 * ratio, "Validation/r_manifold_error": error,
                    "Validation/r": 0.5, "ValidationSpread/r": 0.1, "Validation/drift_guard_notices": notices,
                    "Validation/drift_guard_alarms": alarms})
    return out


HACK = rows([1.0, 1.5, 2.5, 9.0, 20.0], [0.07, 0.09, 0.12, 0.2, 0.3], {4: (1.0, 0.0), 6: (0.0, 1.0), 8: (0.0, 1.0)})
CALM = rows([1.0, 1.2, 2.4, 8.5, 3.0], [0.07, 0.08, 0.09, 0.12, 0.1])


def test_a_hacking_run_is_warned_two_points_before_its_crossing():
    points = replay(HACK, BOUNDS)
    result = outcome(points)
    assert (result.crossing, result.first_notice, result.first_alarm) == (6, 4, 6)
    assert result.lead == (1, 2) and result.false_alarms == 0 and result.error_at_notice == 0.12
    assert live_matches(points)  # the run's own guard logged what the replay finds
    assert not live_matches(replay(CALM, BOUNDS))  # CALM's rows log no finding
    assert table_row("r, none, seed 0", result, outcome(replay(HACK, BOUNDS, every=2))) == (
        "| r, none, seed 0 | 6 (point 3) | 4 (point 2, at 0.120) | 6 (point 3, at 0.200) | 1 point, 2 steps | 0 | "
        "0.300, 20.00x | — | 1 point |")  # validated every 4 steps: the crossing at 8, the notice at 4 (2.5x)


def test_an_alarm_in_a_run_that_never_crosses_is_false():
    result = outcome(replay(CALM, BOUNDS))
    assert (result.crossing, result.first_notice, result.first_alarm, result.false_alarms) == (None, 4, 6, 1)
    assert summary({"hack": outcome(replay(HACK, BOUNDS)), "calm": result}) == (
        "1 of 1 runs that crossed 0.15 were warned at least one validation point before (lead 1-1 points); of the 1 "
        "runs that stayed below, 1 raised false alarms (1 validation points, the first at manifold error "
        "0.120-0.120), and 1 gave notices (the first at manifold error 0.090-0.090; their largest 0.120-0.120)")


def test_the_study_refuses_a_reward_it_does_not_know():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "drift_guard_study", Path(__file__).resolve().parents[2] / "scripts" / "drift_guard_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    quick = study.parse_args(["--quick"])
    assert (quick.rewards, quick.seeds, quick.steps, quick.demo_steps) == (["toy_large", "toy_mix"], [0], 12, 12)
    assert quick.runs.endswith("drift_guard_study_quick")
    assert study.parse_args([]).rewards == list(study.ALL) and len(study.ALL) == 9
    with pytest.raises(SystemExit):
        study.parse_args(["--rewards", "toy_nope"])

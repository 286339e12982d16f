"""The drift guard's rules (:mod:`sage_grpo.rl.drift_guard`), as pure functions of the numbers of the validation points,
each giving :class:`Finding` s: a **notice** (a warning: the drift is coming) or an **alarm** (the bound the guard acts
on: ``--drift_guard stop`` / ``rollback``).

* **Proxy levels** (:func:`proxy_findings`): the drift proxy over its baseline (the base model's own samples) above
  ``--drift_guard_proxy_ratio`` is an alarm; above ``--drift_guard_notice_ratio``, or on course to pass twice that
  within two validation points (its growth since the previous point repeated twice: ratio x (ratio / previous
  ratio)^2), a notice. The growth is per validation point, so the trend looks two validations ahead whatever the
  interval.
* **Per dimension** (:func:`fallen_dimensions`): the training reward risen since the first step (the mean over the
  last ``--drift_guard_window`` validation intervals above the first step's by more than
  ``--drift_guard_reward_rise``) while a watched dimension (a sub-reward of the training reward or a held-out metric,
  scored per validation video) has fallen since the first validation point (its mean over the last
  ``--drift_guard_window`` points below its first value) by more than ``--drift_guard_dimension_fall`` times its
  spread over the first point's validation videos (the base model's) *and* by more than ``--drift_guard_heldout_fall``
  times its first value's magnitude: an alarm that names the dimension. Against the start rather than over the window
  alone, so that a slow collapse is seen as well as a sudden one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

NOTICE, ALARM = "notice", "alarm"
HORIZON = 2  # validation points the trend looks ahead: a crossing it sees coming is noticed a point before it
TREND_TARGET = 2.0  # ... of this many times the notice bound
PROXY_ADVICE = ("the samples are leaving what the base model knows: lower --learning_rate, raise --kl_weight (beta), "
                "refresh the KL anchor less often (a larger --update_ref_model_step), or go back to an earlier "
                "checkpoint (--drift_guard rollback does it at an alarm)")
DIMENSION_ADVICE = ("the reward is earned at the cost of {name}: give it more weight in the training reward "
                    "(--reward_weights; a held-out metric joins it there first), lower --learning_rate, raise "
                    "--kl_weight (beta), or go back to an earlier checkpoint")


@dataclass(frozen=True)
class Finding:
    """One bound crossed at a validation point, with the numbers that crossed it."""

    step: int
    check: str  # "proxy" or "reward_vs_heldout" (a watched dimension fell while the training reward rose)
    message: str
    level: str = ALARM  # NOTICE: logged and reported only; ALARM: the guard's action (--drift_guard) follows
    dimension: Optional[str] = None  # the dimension that fell (reward_vs_heldout)

    @property
    def advice(self) -> str:
        return PROXY_ADVICE if self.check == "proxy" else DIMENSION_ADVICE.format(name=self.dimension)


def projected_ratio(ratio: float, previous: Optional[float]) -> Optional[float]:
    """The proxy ratio :data:`HORIZON` validation points ahead if it grows at each by the factor it grew since the
    previous point (None without a previous point, or when it did not grow)."""
    if previous is None or not previous > 0 or not ratio > previous:
        return None
    return ratio * (ratio / previous) ** HORIZON


def proxy_findings(step: int, proxy: float, baseline: float, previous: Optional[float], bounds) -> List[Finding]:
    """The proxy's finding at ``step`` (at most one): ``bounds`` has ``proxy_ratio`` (the alarm) and ``notice_ratio``
    (the notice, and the trend's target :data:`TREND_TARGET` times it); ``previous``: the ratio at the previous
    validation point."""
    ratio = proxy / baseline if baseline else float("inf")
    measured = f"drift proxy {proxy:.4g} is {ratio:.2f}x its baseline {baseline:.4g}"
    if ratio > bounds.proxy_ratio:
        return [Finding(step, "proxy", f"{measured} (bound --drift_guard_proxy_ratio {bounds.proxy_ratio:g})")]
    if bounds.notice_ratio < bounds.proxy_ratio and ratio > bounds.notice_ratio:
        return [Finding(step, "proxy", f"{measured} (notice bound --drift_guard_notice_ratio {bounds.notice_ratio:g}; "
                                       f"the alarm at {bounds.proxy_ratio:g})", NOTICE)]
    ahead, target = projected_ratio(ratio, previous), TREND_TARGET * bounds.notice_ratio
    if ahead is not None and ahead > target:
        return [Finding(step, "proxy", f"{measured}, up from {previous:.2f}x at the previous validation point: growing "
                                       f"so, it reaches {ahead:.2f}x {HORIZON} validation points on, past {target:g} "
                                       f"({TREND_TARGET:g} x --drift_guard_notice_ratio {bounds.notice_ratio:g})",
                        NOTICE)]
    return []


def fallen_dimensions(step: int, points: List[dict], reward_start: Optional[float], baselines: Dict[str, float],
                      spreads: Dict[str, float], bounds) -> List[Finding]:
    """Alarms for the dimensions that fell since the first validation point while the training reward rose since the
    first step. ``points``: the last validation points with a training reward (``{"step", "reward", "heldout":
    {dimension: value}}``), compared once there are ``bounds.window`` of them, by their means (so that one point does
    not decide); ``reward_start``: the training reward of the first step (the base model's rollouts); ``baselines``
    and ``spreads``: each dimension's value at its first point and its spread over the validation videos there (a
    dimension without a spread is held to the relative bound alone)."""
    if len(points) < bounds.window or reward_start is None:
        return []
    rise = sum(p["reward"] for p in points) / len(points) - reward_start
    if rise <= bounds.reward_rise:
        return []
    alarms = []
    span = f"over the validation points of steps {points[0]['step']}-{step}"
    for name in sorted(points[-1]["heldout"]):
        values = [p["heldout"].get(name) for p in points]
        if name not in baselines or any(v is None or v != v for v in values):
            continue
        now, first = sum(values) / len(values), baselines[name]
        fall, relative = first - now, bounds.heldout_fall * abs(first)
        spread = spreads.get(name)
        if fall <= relative or (spread is not None and fall <= bounds.dimension_fall * spread):
            continue
        spread_text = (f", {fall / spread:.2f}x its spread {spread:.4g} over the validation videos there (bound "
                       f"--drift_guard_dimension_fall {bounds.dimension_fall:g})" if spread is not None and spread > 0
                       else "")
        alarms.append(Finding(step, "reward_vs_heldout", (
            f"{span} the training reward rose by {rise:.4g} from the first step's {reward_start:.4g} (bound "
            f"--drift_guard_reward_rise {bounds.reward_rise:g}) while {name} averaged {now:.4g}, {fall:.4g} below its "
            f"{first:.4g} at the first validation point{spread_text}; above --drift_guard_heldout_fall "
            f"{bounds.heldout_fall:g} x |{first:.4g}| = {relative:.4g}"), dimension=name))
    return alarms

"""The drift guard's study on the toy world (``scripts/drift_guard_study.py``, docs/toy_study.md "Drift guard"): what
the guard said in a run against what the toy world's truth (the validation samples' manifold error) says.

A run's ``metrics.jsonl`` holds everything the guard decides from (the training reward of every step, the
validation points' proxy, scores and spreads), so :func:`replay` runs the guard again over it, with any bounds and
keeping only every k-th validation point (a run validated k times less often); :func:`outcome` compares its
findings with the truth: the validation step where the manifold error first reaches the crossing (0.15), the first
notice and the first alarm of the proxy, the lead (validation points and steps from the first warning to the
crossing), the false alarms (a proxy alarm in a run that never crosses) and the dimensions named as fallen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from sage_grpo.pipeline.drift import watched_dimensions
from sage_grpo.pipeline.validation import PREFIX
from sage_grpo.rl.drift_guard import DriftGuard, DriftWatch, GuardBounds
from sage_grpo.rl.drift_rules import ALARM, Finding
from sage_grpo.tracking.run_dir import is_validation_row

CROSSING = 0.15  # the validation manifold error at which a run has hacked its reward off the manifold


def manifold_key(validation: Sequence[dict]) -> str:
    """The validation rows' manifold error key (``Validation/<reward>_manifold_error``)."""
    keys = [k for k in validation[0] if k.startswith(PREFIX) and k.endswith("manifold_error")]
    if len(keys) != 1:
        raise ValueError(f"expected one manifold error among the validation keys, got {keys}")
    return keys[0]


def replay(rows: Sequence[dict], bounds: GuardBounds, every: int = 1,
           heldout: Optional[Tuple[str, ...]] = None) -> List[Tuple[dict, List[Finding]]]:
    """The guard run again over a run's rows (in the order written): every training step's reward, and every
    ``every``-th validation point from the first; [(validation row, its findings)]."""
    guard, watch = DriftGuard(bounds), DriftWatch((0.5,), "warn", bounds, False, heldout)
    seen, points = 0, []
    for row in rows:
        if not is_validation_row(row):
            guard.record_reward(row["gathered_avg_reward_mean"])
            continue
        seen += 1
        if (seen - 1) % every:
            continue
        dimensions = watched_dimensions(watch, row)
        findings = guard.observe(row["step"], row.get(PREFIX + "drift_proxy"),
                                 {name: value for name, (value, _) in dimensions.items()},
                                 {name: s for name, (_, s) in dimensions.items() if s is not None and s == s})
        points.append((row, findings))
    return points


@dataclass
class Outcome:
    """What the guard said in one run against the truth."""

    steps: List[int]  # the validation points
    crossing: Optional[int]  # the first validation step whose manifold error reached CROSSING (None: never)
    first_notice: Optional[int]  # the first proxy notice / alarm
    first_alarm: Optional[int]
    max_error: float
    max_ratio: float
    error_at_notice: Optional[float] = None  # the manifold error at the first notice ...
    error_at_alarm: Optional[float] = None  # ... and at the first alarm
    false_alarms: int = 0  # proxy alarms in a run that never crosses
    fell: Dict[str, int] = field(default_factory=dict)  # dimension -> the first step the guard named it

    @property
    def first_warning(self) -> Optional[int]:
        warned = [s for s in (self.first_notice, self.first_alarm) if s is not None]
        return min(warned) if warned else None

    @property
    def lead(self) -> Optional[Tuple[int, int]]:
        """(validation points, steps) from the first warning to the crossing; None without either."""
        if self.crossing is None or self.first_warning is None:
            return None
        return (self.steps.index(self.crossing) - self.steps.index(self.first_warning),
                self.crossing - self.first_warning)


def outcome(points: List[Tuple[dict, List[Finding]]], crossing: float = CROSSING) -> Outcome:
    """The :class:`Outcome` of a replay's points."""
    rows = [row for row, _ in points]
    key = manifold_key(rows)
    errors = [row[key] for row in rows]
    steps = [row["step"] for row in rows]
    ratios = [row[PREFIX + "drift_proxy"] / rows[0][PREFIX + "drift_proxy"] for row in rows]

    def first(level: str) -> Optional[int]:
        return next((row["step"] for row, found in points
                     if any(f.check == "proxy" and f.level == level for f in found)), None)

    crossed = next((s for s, e in zip(steps, errors) if e >= crossing), None)
    result = Outcome(steps, crossed, first("notice"), first(ALARM), max(errors), max(ratios))
    if result.first_notice is not None:
        result.error_at_notice = errors[steps.index(result.first_notice)]
    if result.first_alarm is not None:
        result.error_at_alarm = errors[steps.index(result.first_alarm)]
    if crossed is None:
        result.false_alarms = sum(1 for _, found in points for f in found if f.check == "proxy" and f.level == ALARM)
    for row, found in points:
        for f in found:
            if f.dimension is not None:
                result.fell.setdefault(f.dimension, row["step"])
    return result


def live_matches(points: List[Tuple[dict, List[Finding]]]) -> bool:
    """Whether the run's own guard logged the replay's findings (``Validation/drift_guard_notices`` / ``_alarms``)."""
    for row, found in points:
        alarms = sum(f.level == ALARM for f in found)
        if (row.get(PREFIX + "drift_guard_alarms"), row.get(PREFIX + "drift_guard_notices")) != (
                float(alarms), float(len(found) - alarms)):
            return False
    return True


def _step(value: Optional[int], steps: Sequence[int], error: Optional[float] = None) -> str:
    if value is None:
        return "never"
    return f"{value} (point {steps.index(value)}{f', at {error:.3f}' if error is not None else ''})"


def _sparse(sparse: Optional[Outcome]) -> str:
    if sparse is None:
        return "—"
    lead = sparse.lead
    text = ("no crossing" if sparse.crossing is None else
            "no point between step 0 and it" if sparse.steps.index(sparse.crossing) == 1 else
            "**none**" if lead is None or lead[0] < 1 else _count(lead[0], "point"))
    return text + (f", {_count(sparse.false_alarms, 'false alarm')}" if sparse.false_alarms else "")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def table_row(name: str, result: Outcome, sparse: Optional[Outcome]) -> str:
    """One markdown row: the run, its crossing, first notice and alarm (with the manifold error there), lead, false
    alarms, extremes, the dimensions named, and the lead of the same run validated half as often (``sparse``)."""
    lead = result.lead
    lead_text = "—" if result.crossing is None else ("**none**" if lead is None or lead[0] < 1 else
                                                    f"{_count(lead[0], 'point')}, {lead[1]} steps")
    fell = ", ".join(f"{d} ({s})" for d, s in result.fell.items()) or "—"
    return (f"| {name} | {_step(result.crossing, result.steps)} | "
            f"{_step(result.first_notice, result.steps, result.error_at_notice)} | "
            f"{_step(result.first_alarm, result.steps, result.error_at_alarm)} | {lead_text} | "
            f"{result.false_alarms or 0} | {result.max_error:.3f}, {result.max_ratio:.2f}x | {fell} | "
            f"{_sparse(sparse)} |")


TABLE_HEAD = ("| run (reward, arm, seed) | manifold error >= 0.15 at step | first notice (manifold error there) | "
              "first alarm (manifold error there) | lead | false alarms | largest manifold error, proxy ratio | "
              "dimensions named (first step) | validated half as often: lead |\n|---|---|---|---|---|---|---|---|---|")


def summary(outcomes: Dict[str, Outcome]) -> str:
    """One line: how many hacking runs were warned at least one point early, the false alarms, the notices."""
    crossing = [o for o in outcomes.values() if o.crossing is not None]
    early = [o for o in crossing if o.lead is not None and o.lead[0] >= 1]
    quiet = [o for o in outcomes.values() if o.crossing is None]
    noticed = [o for o in quiet if o.first_notice is not None]
    alarmed = [o for o in quiet if o.false_alarms]
    leads = [o.lead[0] for o in early]
    false = (f"{len(alarmed)} raised false alarms ({sum(o.false_alarms for o in alarmed)} validation points, the "
             f"first at manifold error {_range([o.error_at_alarm for o in alarmed])})" if alarmed else
             "none raised a false alarm")
    return (f"{len(early)} of {len(crossing)} runs that crossed {CROSSING} were warned at least one validation point "
            f"before (lead {min(leads, default=0)}-{max(leads, default=0)} points); of the {len(quiet)} runs that "
            f"stayed below, {false}, and {len(noticed)} gave notices (the first at manifold error "
            f"{_range([o.error_at_notice for o in noticed])}; their largest {_range([o.max_error for o in noticed])})")


def _range(values: List[float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return f"{min(finite):.3f}-{max(finite):.3f}" if finite else "—"

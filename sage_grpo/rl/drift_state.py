"""The drift guard's saved state (:meth:`sage_grpo.rl.drift_guard.DriftGuard.state_dict`), read back from a checkpoint:
checked field by field before it is used (:func:`check_guard_state`). A state saved before the notice level and the
per-dimension check against the start existed lacks ``previous_ratio``, ``spread_baseline`` and ``reward_start``; it
is read with them empty (the per-dimension check then starts at the first step after the resume)."""

from __future__ import annotations


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_metrics(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_number(v) for k, v in value.items())


def _is_point(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"step", "reward", "heldout"} and isinstance(value["step"], int)
            and _is_number(value["reward"]) and _is_metrics(value["heldout"]))


_STATE_FIELDS = {  # field -> (is it valid, what it must be)
    "proxy_baseline": (lambda v: v is None or _is_number(v), "a number or None"),
    "heldout_baseline": (_is_metrics, "a mapping of metric names to numbers"),
    "points": (lambda v: isinstance(v, list) and all(_is_point(p) for p in v), "a list of validation points"),
    "reward_sum": (_is_number, "a number"),
    "reward_count": (lambda v: isinstance(v, int) and v >= 0, "a count"),
    "last_clean_step": (lambda v: v is None or isinstance(v, int), "a step or None"),
    "rollbacks": (lambda v: isinstance(v, list) and all(isinstance(s, int) for s in v), "a list of steps"),
}
_LATER_FIELDS = {  # fields a state saved by an earlier version lacks -> (valid, what, the value it is read with)
    "previous_ratio": (lambda v: v is None or _is_number(v), "a number or None", None),
    "spread_baseline": (_is_metrics, "a mapping of metric names to numbers", {}),
    "reward_start": (lambda v: v is None or _is_number(v), "a number or None", None),
}


def check_guard_state(state) -> dict:
    """``ValueError`` naming the first field of a saved guard state that is missing or not what it must be; the state
    with the fields of :data:`_LATER_FIELDS` it lacks filled in."""
    known = set(_STATE_FIELDS) | set(_LATER_FIELDS)
    if not isinstance(state, dict) or not set(_STATE_FIELDS) <= set(state) <= known:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"the drift guard state must hold exactly {sorted(_STATE_FIELDS)} (and may hold "
                         f"{sorted(_LATER_FIELDS)}), got {got}")
    for name, (valid, what) in _STATE_FIELDS.items():
        if not valid(state[name]):
            raise ValueError(f"the drift guard state's {name} must be {what}, got {state[name]!r:.80}")
    filled = dict(state)
    for name, (valid, what, default) in _LATER_FIELDS.items():
        if name not in state:
            filled[name] = default
        elif not valid(state[name]):
            raise ValueError(f"the drift guard state's {name} must be {what}, got {state[name]!r:.80}")
    return filled

"""``--reward_weights`` and the reward registry's other JSON-dict flags, parsed once: config validation checks the
flag with the same parser the reward registry (:mod:`sage_grpo.rewards.registry`) builds the composite with."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping

from sage_grpo.config.schema import shorten

EXAMPLE = '{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}'


def json_dict(value: Mapping | str, label: str, example: str) -> Mapping:
    """A dict given directly or as a JSON string (an empty string is an empty dict)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError) as exc:  # not JSON, nested thousands deep, a 4300+ digit integer
            raise ValueError(f"{label} is not valid JSON ({shorten(str(exc), quote=False)}): {shorten(value)}; "
                             f"e.g. '{example}'") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{label} must be a dict (or its JSON), got {shorten(value)}; e.g. '{example}'")
    return value


def parse_reward_weights(value: Mapping | str | None) -> dict[str, float] | None:
    """``--reward_weights`` as a dict of metric -> weight (JSON strings are parsed); None stays None.

    The one parser of the flag: config validation checks the flag with it and the reward registry builds with it. An
    empty string is the empty dict, which selects the model's fallback weights (the reference's rule, see
    :func:`sage_grpo.rewards.registry.build_reward_fn`); None its default weights.
    """
    if value is None:
        return None
    weights = number_dict(json_dict(value, "reward_weights", EXAMPLE), "reward_weights")
    if weights and not any(weights.values()):
        raise ValueError(f"reward_weights {shorten(value)}: every weight is 0, so the reward is 0 for every video "
                         f"and nothing is learnt; give at least one metric a weight, e.g. '{EXAMPLE}'")
    return weights


def number_dict(value: Mapping, label: str) -> dict[str, float]:
    """``{key: float}`` of a mapping of finite numbers (JSON's ``NaN`` and ``Infinity`` refused: a NaN weight made
    every reward NaN, and the run stopped three steps later blaming the reward)."""
    out = {}
    for key, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"{label}[{key!r}] must be a number, got {shorten(weight)}")
        if not math.isfinite(weight):
            raise ValueError(f"{label}[{key!r}] must be a finite number, got {weight} (e.g. 1.0)")
        out[str(key)] = float(weight)
    return out

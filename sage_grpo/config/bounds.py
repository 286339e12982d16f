"""The range of every number a command takes: each ``int`` and ``float`` option (lists and optional ones included)
of ``post_train.py``, ``generate.py`` and ``python -m sage_grpo.evaluate`` declares one with its field
(``config_field(..., bound=...)``).

A bound is a :class:`Bound`, checked by :func:`sage_grpo.config.validation.check_bounds` before anything loads (a
value outside it is one ``ConfigError`` line: ``[rule] --flag value must be > 0 ... Fix: ...``), or a sentence saying
why the option has no bound of its own (a rule between several options, checked by its own function of
``validation.py``; an option without effect; any integer meaning something). A test fails on a numeric option that
declares none, so a new one cannot go unchecked by oversight. ``nan`` and ``inf`` are refused before the bounds, for every
float option (:func:`~sage_grpo.config.validation.check_finite_options`).
"""

from dataclasses import dataclass
from typing import Optional, Union

MAX_TOKENS = 1 << 16  # no stream of HunyuanVideo-1.5 is near it (1000, 256, 729); a larger one is a typo or a bomb


@dataclass(frozen=True)
class Bound:
    """``low <= value <= high`` (``<`` where open; None: unbounded on that side). ``rule`` names the rule in the
    message (default ``<option>-positive``, ``-nonnegative`` or ``-range``), ``why`` follows the range, ``fix`` is the
    valid alternative offered (default: the option's default)."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    rule: Optional[str] = None
    why: str = ""
    fix: Optional[str] = None

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below  # False for nan, which no comparison passes

    def text(self) -> str:
        """The range as the message says it: ``> 0``, ``>= 1``, ``in [0, 1)``."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def rule_for(self, name: str) -> str:
        if self.rule:
            return self.rule
        if self.high is None and self.low == 0:
            return f"{name}-{'positive' if self.low_open else 'nonnegative'}"
        return f"{name}-positive" if self.high is None and self.low == 1 else f"{name}-range"


Entry = Union[Bound, str]
POSITIVE = Bound(0, low_open=True)  # a float that must be > 0
AT_LEAST_1 = Bound(1)  # a count: an integer >= 1
NON_NEGATIVE = Bound(0)
TOKENS = Bound(1, MAX_TOKENS, fix="see --help for the default")
UNIT_OPEN_HIGH = Bound(0, 1, high_open=True)  # [0, 1)
SEED = "check_seeds: an integer in [0, 2**63)"
NO_EFFECT = "no effect (accepted for compatibility with the reference)"
KL_COEFFICIENT = Bound(0, rule="kl-nonnegative", fix="use --kl_weight 0 to disable the KL terms")

"""Adaptive KL coefficient β, as ``AdaptiveKLController`` of the reference lineage (paper App. A.6;
docs/reference.md#the-kl-terms-and-the-controller).

Built from the reference's flags (:func:`reference_coefs`): target = kl_weight, β_min = clamp(kl_min_coef or
kl_coef, 0, kl_weight) (the reference's ``or``: ``--kl_min_coef 0`` means ``--kl_coef``), β_0 = clamp(kl_coef, β_min,
kl_weight), β_max = kl_weight. ``kl_coef`` is the β to use now (read before the update); ``update(kl)`` is then
called once per inner iteration with that iteration's effective KL:

    n = number of updates so far (after counting this one)
    n < horizon:  β = β_min + (target − β_min)·n / horizon                  linear warm-up
    otherwise, if >= window KL values are stored and m = mean of the last ``window``:
        m − target >  0.5·target  ->  β ← 0.9·β                             KL too large
        m − target < −0.5·target  ->  β ← 1.1·β                             KL too small
        β ← clamp(β, β_min, β_max)

The history keeps the last ``horizon`` values. This is a proportional bang-bang rule, not a PID controller.

β = 0: the reference computes the KL, and updates the controller, only while β > 0. β_min > 0 unless kl_coef = 0
and kl_min_coef = 0 (the ``or``), and then β_0 = 0 too, so β is either > 0 for the whole run or 0 for the whole run
(:func:`beta_stays_zero`): ``--kl_coef 0 --kl_min_coef 0`` is a run without KL, whatever ``--kl_weight`` says. Such a
controller never moves (``update`` records nothing), and the trainer runs without the KL term and without loading
the reference model (``rl.kl_mode_of``), as for ``--kl_weight 0``.

``update`` takes a Python float or a 0-d tensor. Given tensors (the trainer passes the world-mean KL as an fp64 device
tensor) β becomes a device tensor after the warm-up and nothing is copied to the host: the training loop keeps running
ahead of the GPU. Built with a ``device`` (the trainer), β is a 0-d fp64 tensor on it from the start, warm-up
included: what β is is decided once per run, so the loss never asks. The arithmetic is the same fp64 arithmetic
either way; ``state_dict`` returns plain floats.

Departures from the reference (TVRL ``grpo_commons.py``; the SAGE copy is not public):
- the warm-up length is ``horizon`` (the reference hard-codes 100, its default horizon) and the averaging
  window is a parameter (hard-coded 10 there); with the defaults the behaviour is identical;
- ``state_dict``/``load_state_dict`` make it resumable; the reference does not checkpoint it (docs/reference.md#d29).

``--kl_controller adaptive`` (the default) in the KL-controller table (:mod:`sage_grpo.rl.kl_controllers`): this module
gives the table :func:`build`, :func:`stays_zero` and the checks of a saved state (:data:`STATE_CHECKS`).
"""
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Optional, Tuple, Union

import torch


@dataclass
class AdaptiveKLController:
    """β controller; use ``from_flags`` to build it from the reference's command-line values."""

    target_kl: float
    min_coef: float
    max_coef: float
    init_coef: float
    horizon: int = 100
    window: int = 10
    device: Optional[torch.device] = None  # given: β is always a 0-d fp64 tensor there (no host copy, no type test)
    _coef: Union[float, torch.Tensor] = field(init=False)
    _held: Callable = field(init=False, repr=False)  # float -> β as this controller holds it
    _num_updates: int = field(init=False, default=0)
    _history: list = field(init=False, default_factory=list, repr=False)  # floats or 0-d fp64 tensors

    @property
    def stays_zero(self) -> bool:
        """β_0 = 0 (then β_min = 0 too from the flags): the reference never computes the KL nor updates β."""
        return self.init_coef == 0

    def __post_init__(self) -> None:
        if not 1 <= self.window <= self.horizon:
            raise ValueError(f"need 1 <= window <= horizon, got window={self.window}, horizon={self.horizon}")
        if not 0 <= self.min_coef <= self.init_coef <= self.max_coef:
            raise ValueError(f"need 0 <= min <= init <= max, got {self.min_coef}, {self.init_coef}, {self.max_coef}")
        # a fill kernel on the device, not a host-to-device copy: the training loop does not wait for the GPU
        self._held = float if self.device is None else partial(torch.full, (), dtype=torch.float64, device=self.device)
        self._coef = self._held(self.init_coef)

    @classmethod
    def from_flags(
        cls, kl_weight: float, kl_coef: float, kl_min_coef: float, horizon: int = 100, window: int = 10,
        device: Optional[torch.device] = None,
    ) -> "AdaptiveKLController":
        """target = max = kl_weight; (min, init) from :func:`reference_coefs`."""
        if kl_weight <= 0:
            raise ValueError(f"the KL controller needs kl_weight > 0, got {kl_weight}")
        min_coef, init_coef = reference_coefs(kl_weight, kl_coef, kl_min_coef)
        return cls(kl_weight, min_coef, kl_weight, init_coef, horizon, window, device)

    @property
    def kl_coef(self) -> Union[float, torch.Tensor]:
        """β to use for the current iteration (a 0-d fp64 tensor on ``device`` when one is given; else a float until
        tensors have moved it)."""
        return self._coef

    def update(self, kl: Union[float, torch.Tensor]) -> Union[float, torch.Tensor]:
        """Record this iteration's KL and move β (warm-up ramp, then ×0.9 / ×1.1); returns the new β. A controller
        that :attr:`stays_zero` records nothing and returns 0 (the reference skips the update at β = 0)."""
        if self.stays_zero:
            return self._coef
        self._num_updates += 1
        self._history.append(kl.detach().to(torch.float64) if isinstance(kl, torch.Tensor) else float(kl))
        del self._history[: -self.horizon]
        if self._num_updates < self.horizon:
            progress = self._num_updates / self.horizon
            self._coef = self._held(self.min_coef + (self.target_kl - self.min_coef) * progress)
        elif len(self._history) >= self.window:
            recent = self._history[-self.window :]
            if any(isinstance(value, torch.Tensor) for value in recent):
                self._coef = self._adjusted_on_device(recent)
            else:
                self._coef = self._held(self._adjusted(sum(recent) / self.window))
        return self._coef

    def _adjusted(self, recent_kl: float) -> float:
        """β after the bang-bang rule for the recent mean KL, clamped to [min, max]."""
        error = recent_kl - self.target_kl
        coef = self._coef
        if error > 0.5 * self.target_kl:
            coef *= 0.9
        elif error < -0.5 * self.target_kl:
            coef *= 1.1
        return max(self.min_coef, min(self.max_coef, coef))

    def _adjusted_on_device(self, recent: list) -> torch.Tensor:
        """:meth:`_adjusted` in tensor operations (the same fp64 sums, left to right), without a host copy."""
        device = next(value.device for value in recent if isinstance(value, torch.Tensor))
        total = torch.zeros((), dtype=torch.float64, device=device)
        for value in recent:
            total = total + value
        error = total / self.window - self.target_kl
        coef = torch.as_tensor(self._coef, dtype=torch.float64, device=device)
        coef = torch.where(error > 0.5 * self.target_kl, coef * 0.9,
                           torch.where(error < -0.5 * self.target_kl, coef * 1.1, coef))
        return coef.clamp(self.min_coef, self.max_coef)

    def state_dict(self) -> dict:
        return {"kl_coef": float(self._coef), "num_updates": self._num_updates,
                "history": [float(value) for value in self._history]}

    def load_state_dict(self, state: dict) -> None:
        self._coef = self._held(float(state["kl_coef"]))
        self._num_updates = int(state["num_updates"])
        self._history = [float(value) for value in state["history"]]


def reference_coefs(kl_weight: float, kl_coef: float, kl_min_coef: float) -> Tuple[float, float]:
    """(β_min, β_0) as the reference builds them: β_min = clamp(kl_min_coef or kl_coef, 0, kl_weight) (a
    ``kl_min_coef`` of 0 falls back to ``kl_coef``), β_0 = clamp(kl_coef, β_min, kl_weight)."""
    floor = kl_min_coef if kl_min_coef else kl_coef
    min_coef = min(max(floor, 0.0), kl_weight)
    return min_coef, min(max(kl_coef, min_coef), kl_weight)


def beta_stays_zero(kl_weight: float, kl_coef: float, kl_min_coef: float) -> bool:
    """A KL weight whose β is 0 for the whole run (``kl_coef`` 0 and ``kl_min_coef`` 0): the reference then never
    computes the KL (it does only while β > 0), so the run has no KL term."""
    return kl_weight > 0 and reference_coefs(kl_weight, kl_coef, kl_min_coef)[1] == 0


def build(options, device) -> AdaptiveKLController:
    """The table's entry: the controller of ``--kl_weight``, ``--kl_coef`` and ``--kl_min_coef`` with β on ``device``."""
    return AdaptiveKLController.from_flags(options.kl_weight, options.kl_coef, options.kl_min_coef, device=device)


def stays_zero(options) -> bool:
    """The table's entry: β 0 for the whole run (:func:`beta_stays_zero`)."""
    return beta_stays_zero(options.kl_weight, options.kl_coef, options.kl_min_coef)


def _number(value) -> bool:
    return type(value) in (int, float)


# What a resume checks of a saved state before any model loads: a NaN or inf β would make every loss NaN.
STATE_CHECKS = {
    "kl_coef": (lambda v: _number(v) and 0 <= v < math.inf, "a finite number >= 0"),
    "num_updates": (lambda v: type(v) is int and v >= 0, "a non-negative integer"),
    "history": (lambda v: isinstance(v, list) and len(v) <= 100_000 and all(map(_number, v)), "a list of numbers"),
}

"""The drift sentinel (``--drift_guard``): at every validation point, two checks against bounds, and an action.

* **Proxy**: the drift proxy of the validation samples (:mod:`sage_grpo.rl.drift`, the base model's denoising error)
  over its *baseline*, the proxy of the base model's own samples (the first validation point of a fresh run, at step
  0, where the policy is the base model), above ``--drift_guard_proxy_ratio``. A ratio rather than a level: the
  denoising error's scale depends on the model, the latent space and the validation prompts; its ratio to the base
  model's own samples does not.
* **Reward against held-out**: over the last ``--drift_guard_window`` validation points, the training reward (the
  mean ``avg`` reward of the steps since the previous point) rising by more than ``--drift_guard_reward_rise`` while
  a held-out metric (higher is better) falls by more than ``--drift_guard_heldout_fall`` times its first value's
  magnitude: the training reward earned while what it should stand for gets worse. The rise and fall are the
  least-squares line's change over the window, so one noisy point does not decide.

The guard only decides: :meth:`DriftGuard.observe` returns the bounds crossed at a point (:class:`Alarm`) and the
trainer carries out the action (``warn``, ``stop``, ``rollback``; docs/failures.md, "Drift guard"). Its state (the
baselines, the window, the reward of the steps since the last point, the last clean point, the rollbacks) is plain
data in :meth:`state_dict`, saved with every checkpoint, so a resumed run watches on where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple

from sage_grpo.rl.kl import KLMode



class DriftOptions(Protocol):
    """What the drift watch is decided from: the configuration's ``drift`` section (declared here by shape, so the
    GRPO math imports no configuration)."""

    drift_proxy: bool
    drift_proxy_sigmas: List[float]
    drift_guard: str
    drift_guard_proxy_ratio: float
    drift_guard_window: int
    drift_guard_reward_rise: float
    drift_guard_heldout_fall: float
    drift_guard_heldout: Optional[List[str]]


@dataclass(frozen=True)
class GuardBounds:
    """The thresholds (``--drift_guard_*``)."""

    proxy_ratio: float  # proxy / baseline above this is an alarm
    window: int  # validation points of the reward-against-held-out check (>= 2)
    reward_rise: float  # the training reward's fitted change over the window above this ...
    heldout_fall: float  # ... while a held-out metric's fitted fall exceeds this times |its first value|


@dataclass(frozen=True)
class DriftWatch:
    """What a run watches, decided once from its flags (:func:`drift_watch_of`); every part asks this."""

    sigmas: Tuple[float, ...]  # the proxy's noise levels; empty: no proxy
    action: str  # --drift_guard: off, warn, stop, rollback
    bounds: GuardBounds
    base_copy: bool  # the proxy needs a frozen copy of the base transformer (below)
    heldout: Tuple[str, ...] = ()  # --drift_guard_heldout: the validation keys the reward-against-held-out bound watches

    @property
    def proxy(self) -> bool:
        return bool(self.sigmas)

    @property
    def guarded(self) -> bool:
        return self.action != "off"


def drift_watch_of(options: DriftOptions, validation_interval: int, use_lora: bool, kl_mode: KLMode) -> DriftWatch:
    """The run's :class:`DriftWatch`. ``--drift_guard`` turns the proxy on; without validation points
    (``--validation_interval`` 0) both are off. The base model costs nothing with LoRA (the policy with its adapters
    disabled) nor with a KL anchor that never moves (the reference is the base model); otherwise (no KL, or the moving
    anchor) it is a frozen copy of the transformer, placed like the reference."""
    on = (options.drift_proxy or options.drift_guard != "off") and validation_interval > 0
    reference_is_base = kl_mode.uses_reference and not kl_mode.moving_anchor
    bounds = GuardBounds(options.drift_guard_proxy_ratio, options.drift_guard_window, options.drift_guard_reward_rise,
                         options.drift_guard_heldout_fall)
    return DriftWatch(tuple(options.drift_proxy_sigmas) if on else (), options.drift_guard if on else "off", bounds,
                      base_copy=on and not use_lora and not reference_is_base,
                      heldout=tuple(options.drift_guard_heldout or ()) if on else ())


@dataclass(frozen=True)
class Alarm:
    """One bound crossed at a validation point, with the numbers that crossed it."""

    step: int
    check: str  # "proxy" or "reward_vs_heldout"
    message: str


def fitted_change(values: List[float]) -> float:
    """The change over the sequence of the least-squares line through (i, values[i]): slope * (n - 1)."""
    n = len(values)
    mean_i, mean_v = (n - 1) / 2.0, sum(values) / n
    spread = sum((i - mean_i) ** 2 for i in range(n))
    return sum((i - mean_i) * (v - mean_v) for i, v in enumerate(values)) / spread * (n - 1)


class DriftGuard:
    """Feed it each training step's reward (:meth:`record_reward`) and each validation point (:meth:`observe`)."""

    def __init__(self, bounds: GuardBounds):
        if bounds.window < 2:
            raise ValueError(f"the drift guard's window needs at least 2 validation points, got {bounds.window}")
        self.bounds = bounds
        self.proxy_baseline: Optional[float] = None
        self.heldout_baseline: Dict[str, float] = {}
        self.points: List[dict] = []  # the last `window` points: {"step", "reward", "heldout": {name: value}}
        self.reward_sum, self.reward_count = 0.0, 0  # the training reward of the steps since the last point
        self.last_clean_step: Optional[int] = None  # the newest validation point that crossed no bound
        self.rollbacks: List[int] = []  # the checkpoint steps rolled back to

    def record_reward(self, reward: float) -> None:
        if reward == reward:  # a step whose reward failed everywhere (NaN) says nothing
            self.reward_sum += reward
            self.reward_count += 1

    def observe(self, step: int, proxy: Optional[float], heldout: Dict[str, float]) -> List[Alarm]:
        """The alarms of the validation point at ``step``: its proxy (None: not measured) and held-out metrics."""
        alarms = []
        if proxy is not None:
            if self.proxy_baseline is None:
                self.proxy_baseline = proxy
            ratio = self.proxy_ratio(proxy)
            if ratio > self.bounds.proxy_ratio:
                alarms.append(Alarm(step, "proxy", f"drift proxy {proxy:.4g} is {ratio:.2f}x its baseline "
                                                   f"{self.proxy_baseline:.4g} (bound --drift_guard_proxy_ratio "
                                                   f"{self.bounds.proxy_ratio:g})"))
        if self.reward_count:  # the step-0 point has no training reward before it and joins no window
            reward = self.reward_sum / self.reward_count
            self.points = (self.points + [{"step": step, "reward": reward, "heldout": dict(heldout)}])[
                -self.bounds.window:]
            alarms += self._reward_against_heldout(step)
        for name, value in heldout.items():
            self.heldout_baseline.setdefault(name, value)
        self.reward_sum, self.reward_count = 0.0, 0
        if not alarms:
            self.last_clean_step = step
        return alarms

    def rollback_target(self, checkpoint_steps) -> Optional[int]:
        """The step of the newest checkpoint at or before the last point that crossed no bound, if there is one
        and it was not rolled back to before (a drift that came back after a rollback is not rolled back again)."""
        clean = self.last_clean_step
        target = max((s for s in checkpoint_steps if clean is not None and s <= clean), default=None)
        return None if target in self.rollbacks else target

    def rolled_back(self, step: int) -> None:
        """Note a rollback to the checkpoint of ``step``: the reward-against-held-out window starts again."""
        self.rollbacks.append(step)
        self.points.clear()

    def proxy_ratio(self, proxy: float) -> float:
        return proxy / self.proxy_baseline if self.proxy_baseline else float("inf")

    def _reward_against_heldout(self, step: int) -> List[Alarm]:
        if len(self.points) < self.bounds.window:
            return []
        rise = fitted_change([p["reward"] for p in self.points])
        if rise <= self.bounds.reward_rise:
            return []
        alarms = []
        first = self.points[0]["step"]
        for name in sorted(self.points[-1]["heldout"]):
            values = [p["heldout"].get(name) for p in self.points]
            if any(v is None or v != v for v in values):
                continue
            fall = -fitted_change(values)
            bound = self.bounds.heldout_fall * abs(self.heldout_baseline.get(name, values[0]))
            if fall > bound:
                alarms.append(Alarm(step, "reward_vs_heldout",
                                    f"over steps {first}-{step} the training reward rose by {rise:.4g} (bound "
                                    f"--drift_guard_reward_rise {self.bounds.reward_rise:g}) while {name} fell by "
                                    f"{fall:.4g} (bound --drift_guard_heldout_fall {self.bounds.heldout_fall:g} x "
                                    f"|{self.heldout_baseline.get(name, values[0]):.4g}| = {bound:.4g})"))
        return alarms

    def state_dict(self) -> dict:
        return {"proxy_baseline": self.proxy_baseline, "heldout_baseline": dict(self.heldout_baseline),
                "points": [dict(p, heldout=dict(p["heldout"])) for p in self.points],
                "reward_sum": self.reward_sum, "reward_count": self.reward_count,
                "last_clean_step": self.last_clean_step, "rollbacks": list(self.rollbacks)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; read back from a checkpoint, it is checked first
        (:func:`check_guard_state`)."""
        check_guard_state(state)
        self.proxy_baseline = state["proxy_baseline"]
        self.heldout_baseline = dict(state["heldout_baseline"])
        self.points = [dict(p, heldout=dict(p["heldout"])) for p in state["points"]][-self.bounds.window:]
        self.reward_sum, self.reward_count = state["reward_sum"], state["reward_count"]
        self.last_clean_step = state["last_clean_step"]
        self.rollbacks = list(state["rollbacks"])


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


def check_guard_state(state) -> None:
    """``ValueError`` naming the first field of a saved guard state that is missing or not what it must be."""
    if not isinstance(state, dict) or set(state) != set(_STATE_FIELDS):
        raise ValueError(f"the drift guard state must hold exactly {sorted(_STATE_FIELDS)}, got "
                         f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    for name, (valid, what) in _STATE_FIELDS.items():
        if not valid(state[name]):
            raise ValueError(f"the drift guard state's {name} must be {what}, got {state[name]!r:.80}")

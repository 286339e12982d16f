"""The drift sentinel (``--drift_guard``): at every validation point, checks against bounds (the rules and their
levels, notice and alarm, are :mod:`sage_grpo.rl.drift_rules`), and an action.

* **Proxy**: the drift proxy of the validation samples (:mod:`sage_grpo.rl.drift`, the base model's denoising error)
  over its *baseline*, the proxy of the base model's own samples (the first validation point of a fresh run, at step
  0, where the policy is the base model). An alarm above ``--drift_guard_proxy_ratio``; a notice before it, above
  ``--drift_guard_notice_ratio`` or on course to pass twice that within two validation points. A ratio rather than
  a level: the denoising error's scale depends on the model, the latent space and the validation prompts; its ratio
  to the base model's own samples does not.
* **Per dimension**: over the last ``--drift_guard_window`` validation points, the training reward (the mean ``avg``
  reward of the steps since the previous point) rising while a watched dimension falls: by default every score of
  the validation videos, that is every sub-reward of the training reward (VideoAlign's VQ, MQ, TA; a mixture's
  terms) and every held-out metric (``--validation_metrics``), the manifold error and ``avg`` itself excepted. The
  alarm names the dimension that fell.

The guard only decides: :meth:`DriftGuard.observe` returns what crossed a bound at a point (:class:`Finding`) and the
trainer carries out the action on the alarms (``warn``, ``stop``, ``rollback``; docs/failures.md, "Drift guard"); a
notice never acts. Its state (the baselines, the window, the reward of the steps since the last point, the last clean
point, the rollbacks) is plain data in :meth:`state_dict`, saved with every checkpoint, so a resumed run watches on
where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple

from sage_grpo.rl.drift_rules import Finding, fallen_dimensions, proxy_findings
from sage_grpo.rl.drift_state import check_guard_state
from sage_grpo.rl.kl import KLMode

NO_DIMENSION = "none"  # --drift_guard_heldout none: no dimension watched


class DriftOptions(Protocol):
    """What the drift watch is decided from: the configuration's ``drift`` section (declared here by shape, so the
    GRPO math imports no configuration)."""

    drift_proxy: bool
    drift_proxy_sigmas: List[float]
    drift_guard: str
    drift_guard_proxy_ratio: float
    drift_guard_notice_ratio: float
    drift_guard_window: int
    drift_guard_reward_rise: float
    drift_guard_heldout_fall: float
    drift_guard_dimension_fall: float
    drift_guard_heldout: Optional[List[str]]


@dataclass(frozen=True)
class GuardBounds:
    """The thresholds (``--drift_guard_*``)."""

    proxy_ratio: float  # proxy / baseline above this is an alarm (8 by default)
    window: int  # the per-dimension check compares the means of the last `window` validation points (>= 2) ...
    reward_rise: float  # ... the training reward's rise since the first step above this ...
    heldout_fall: float  # ... while a dimension's fall since the first point exceeds this times |its first value| ...
    notice_ratio: float = 2.0  # proxy / baseline above this, or on course to pass twice it within two points: a notice
    dimension_fall: float = 1.0  # ... and this times its spread over the validation videos at its first point


@dataclass(frozen=True)
class DriftWatch:
    """What a run watches, decided once from its flags (:func:`drift_watch_of`); every part asks this."""

    sigmas: Tuple[float, ...]  # the proxy's noise levels; empty: no proxy
    action: str  # --drift_guard: off, warn, stop, rollback
    bounds: GuardBounds
    base_copy: bool  # the proxy needs a frozen copy of the base transformer (below)
    heldout: Optional[Tuple[str, ...]] = None  # --drift_guard_heldout: the dimensions watched; None: every score of
    # the validation videos (the training reward's sub-rewards and the held-out metrics)

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
                         options.drift_guard_heldout_fall, options.drift_guard_notice_ratio,
                         options.drift_guard_dimension_fall)
    named = options.drift_guard_heldout
    heldout = () if not on or named == [NO_DIMENSION] else None if named is None else tuple(named)
    return DriftWatch(tuple(options.drift_proxy_sigmas) if on else (), options.drift_guard if on else "off", bounds,
                      base_copy=on and not use_lora and not reference_is_base, heldout=heldout)


class DriftGuard:
    """Feed it each training step's reward (:meth:`record_reward`) and each validation point (:meth:`observe`)."""

    def __init__(self, bounds: GuardBounds):
        if bounds.window < 2:
            raise ValueError(f"the drift guard's window needs at least 2 validation points, got {bounds.window}")
        self.bounds = bounds
        self.proxy_baseline: Optional[float] = None
        self.previous_ratio: Optional[float] = None  # the proxy ratio at the previous validation point
        self.heldout_baseline: Dict[str, float] = {}  # each watched dimension's first value ...
        self.spread_baseline: Dict[str, float] = {}  # ... and its spread over the validation videos there
        self.points: List[dict] = []  # the last `window` points: {"step", "reward", "heldout": {name: value}}
        self.reward_sum, self.reward_count = 0.0, 0  # the training reward of the steps since the last point
        self.reward_start: Optional[float] = None  # the training reward of the first step (the base model's rollouts)
        self.last_clean_step: Optional[int] = None  # the newest validation point that raised neither notice nor alarm
        self.rollbacks: List[int] = []  # the checkpoint steps rolled back to

    def record_reward(self, reward: float) -> None:
        if reward == reward:  # a step whose reward failed everywhere (NaN) says nothing
            self.reward_start = reward if self.reward_start is None else self.reward_start
            self.reward_sum += reward
            self.reward_count += 1

    def observe(self, step: int, proxy: Optional[float], heldout: Dict[str, float],
                spreads: Optional[Dict[str, float]] = None) -> List[Finding]:
        """The notices and alarms of the validation point at ``step``: its proxy (None: not measured), the watched
        dimensions' values (``heldout``) and their spreads over the validation videos (``spreads``; a dimension
        without one is held to the relative bound alone)."""
        findings = []
        if proxy is not None:
            if self.proxy_baseline is None:
                self.proxy_baseline = proxy
            findings += proxy_findings(step, proxy, self.proxy_baseline, self.previous_ratio, self.bounds)
            self.previous_ratio = self.proxy_ratio(proxy)
        if self.reward_count:  # the step-0 point has no training reward before it and joins no window
            reward = self.reward_sum / self.reward_count
            self.points = (self.points + [{"step": step, "reward": reward, "heldout": dict(heldout)}])[
                -self.bounds.window:]
            findings += fallen_dimensions(step, self.points, self.reward_start, self.heldout_baseline,
                                          self.spread_baseline, self.bounds)
        for name, value in heldout.items():
            self.heldout_baseline.setdefault(name, value)
            spread = (spreads or {}).get(name)
            if spread is not None and spread == spread and name not in self.spread_baseline:
                self.spread_baseline[name] = spread
        self.reward_sum, self.reward_count = 0.0, 0
        if not findings:
            self.last_clean_step = step
        return findings

    def rollback_target(self, checkpoint_steps) -> Optional[int]:
        """The step of the newest checkpoint at or before the last point that raised neither notice nor alarm (before
        the drift was seen coming), if there is one and it was not rolled back to before (a drift that came back after
        a rollback is not rolled back again)."""
        clean = self.last_clean_step
        target = max((s for s in checkpoint_steps if clean is not None and s <= clean), default=None)
        return None if target in self.rollbacks else target

    def rolled_back(self, step: int) -> None:
        """Note a rollback to the checkpoint of ``step``: the per-dimension window and the proxy's trend start again."""
        self.rollbacks.append(step)
        self.points.clear()
        self.previous_ratio = None

    def proxy_ratio(self, proxy: float) -> float:
        return proxy / self.proxy_baseline if self.proxy_baseline else float("inf")

    def state_dict(self) -> dict:
        return {"proxy_baseline": self.proxy_baseline, "heldout_baseline": dict(self.heldout_baseline),
                "points": [dict(p, heldout=dict(p["heldout"])) for p in self.points],
                "reward_sum": self.reward_sum, "reward_count": self.reward_count,
                "last_clean_step": self.last_clean_step, "rollbacks": list(self.rollbacks),
                "previous_ratio": self.previous_ratio, "spread_baseline": dict(self.spread_baseline),
                "reward_start": self.reward_start}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; read back from a checkpoint, it is checked first
        (:func:`~sage_grpo.rl.drift_state.check_guard_state`)."""
        state = check_guard_state(state)
        self.proxy_baseline, self.previous_ratio = state["proxy_baseline"], state["previous_ratio"]
        self.reward_start = state["reward_start"]
        self.heldout_baseline = dict(state["heldout_baseline"])
        self.spread_baseline = dict(state["spread_baseline"])
        self.points = [dict(p, heldout=dict(p["heldout"])) for p in state["points"]][-self.bounds.window:]
        self.reward_sum, self.reward_count = state["reward_sum"], state["reward_count"]
        self.last_clean_step = state["last_clean_step"]
        self.rollbacks = list(state["rollbacks"])

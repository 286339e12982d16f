"""The KL-controller table: ``--kl_controller`` name -> the module that builds the controller of the KL weight β.

The configuration reads its choices here (:data:`KL_CONTROLLER_NAMES`, a live view of the table), so this module
imports no torch; a controller's module is imported when the run builds it (:func:`build_kl_controller`).

A controller module defines

* ``build(options, device) -> KLController``: the controller of a run from its trust-region options
  (:class:`TrustRegionOptions`) on the run's device;
* optionally ``stays_zero(options) -> bool``: β is 0 for the whole run, so the run has no KL term and loads no
  reference model (:func:`~sage_grpo.rl.kl.kl_mode_of` asks; absent: β > 0 whenever ``--kl_weight`` > 0);
* optionally ``STATE_CHECKS``: ``{key: (test, "what it must be")}`` for every key its ``load_state_dict`` reads, the
  checks a resume runs on the saved state before any model loads (absent: the state holds nothing to check).

Adding a controller is that one file in ``sage_grpo/rl/`` and one line here, ``"mine": "sage_grpo.rl.kl_mine"``;
``--kl_controller mine`` then selects it. A checkpoint records whose state it holds (:class:`NamedKLController`), and a
resume refuses another controller's state (:func:`saved_controller`).
"""

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Protocol, Tuple

KL_CONTROLLERS: Dict[str, str] = {
    "adaptive": "sage_grpo.rl.kl_controller",  # the reference's (the default): warm-up, then x0.9 / x1.1 to a target
    "constant": "sage_grpo.rl.kl_constant",  # beta = --kl_weight at every update
}
KL_CONTROLLER_NAMES = KL_CONTROLLERS.keys()  # --kl_controller's choices (a line added later is a choice too)
DEFAULT_KL_CONTROLLER = "adaptive"  # what a checkpoint written before the table holds
STATE_KEY = "controller"  # the key of a saved controller state that names its controller


class TrustRegionOptions(Protocol):
    """What a controller is built from: the configuration's ``trust_region`` section (declared here by shape, so the
    GRPO math imports no configuration)."""

    kl_weight: float
    kl_coef: float
    kl_min_coef: float
    kl_controller: str


class KLController(Protocol):
    """What the policy pass and the checkpoint use of a controller."""

    @property
    def kl_coef(self) -> Any:
        """β of the current inner iteration, read before :meth:`update`: a 0-d fp64 tensor on the run's device."""

    def update(self, kl: Any) -> Any:
        """Take the iteration's world-mean effective KL (a 0-d fp64 device tensor) and move β; returns the new β."""

    def state_dict(self) -> dict:
        """Plain data (numbers, strings, lists, dicts): saved in every checkpoint's training state."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s data (checked by the module's ``STATE_CHECKS`` first)."""


def controller_module(name: str):
    """The module of table entry ``name``; ValueError naming the valid choices otherwise."""
    if name not in KL_CONTROLLERS:
        raise ValueError(f"unknown kl_controller {name!r}; valid choices: {', '.join(KL_CONTROLLERS)}")
    return importlib.import_module(KL_CONTROLLERS[name])


@dataclass
class NamedKLController:
    """A controller under its table name: its saved state names it (``"controller": name``), so a resume can tell
    whose state a checkpoint holds."""

    name: str
    controller: KLController

    @property
    def kl_coef(self) -> Any:
        return self.controller.kl_coef

    def update(self, kl: Any) -> Any:
        return self.controller.update(kl)

    def state_dict(self) -> dict:
        return {STATE_KEY: self.name, **self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        saved = saved_controller(state)
        if saved != self.name:
            raise ValueError(f"the saved KL-controller state is the {saved!r} controller's; this run's is {self.name!r}")
        self.controller.load_state_dict({key: value for key, value in state.items() if key != STATE_KEY})


def build_kl_controller(name: str, trust_region: TrustRegionOptions, device: Any) -> NamedKLController:
    """The run's controller ``name`` (``--kl_controller``) from its trust-region options, β on ``device``."""
    return NamedKLController(name, controller_module(name).build(trust_region, device))


def stays_zero(trust_region: TrustRegionOptions) -> bool:
    """Whether the run's controller keeps β at 0 for the whole run (its module's ``stays_zero``; absent: never)."""
    test = getattr(controller_module(trust_region.kl_controller), "stays_zero", None)
    return bool(test is not None and test(trust_region))


def saved_controller(state: dict) -> str:
    """The table name of the controller whose ``state`` a checkpoint holds (a state without a name is from before the
    table: the adaptive controller's, then the only one); ValueError for a name the table lacks."""
    name = state.get(STATE_KEY, DEFAULT_KL_CONTROLLER)
    if not isinstance(name, str) or name not in KL_CONTROLLERS:
        raise ValueError(f"must name a KL controller of this version ({', '.join(KL_CONTROLLERS)})")
    return name


def state_checks(name: str) -> Dict[str, Tuple[Callable[[Any], bool], str]]:
    """The checks of controller ``name``'s saved state: ``{key: (test, "what it must be")}``."""
    return dict(getattr(controller_module(name), "STATE_CHECKS", {}))

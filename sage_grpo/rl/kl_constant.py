"""``--kl_controller constant``: β = ``--kl_weight`` at every update, the fixed KL coefficient of GRPO as most
flow-matching GRPO work uses it (a constant β on the KL to a reference; docs/configuration.md, "KL controller").

Unlike the reference's adaptive β (:mod:`sage_grpo.rl.kl_controller`), there is no warm-up from ``--kl_min_coef``, no
step toward a target KL and nothing that depends on the KL measured: the KL term's weight is exactly the number
given, which makes a KL ablation's β one number, and ``--kl_coef`` and ``--kl_min_coef`` are unused. β is never 0
(``--kl_weight 0`` is a run without KL), so the controller has no ``stays_zero``. It keeps no state.
"""

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch


@dataclass
class ConstantKLController:
    """β = ``beta`` for the whole run: a 0-d fp64 tensor on ``device`` (a float without one)."""

    beta: float
    device: Optional[torch.device] = None
    _coef: Union[float, torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"the constant KL controller needs kl_weight > 0, got {self.beta}")
        self._coef = (float(self.beta) if self.device is None
                      else torch.full((), self.beta, dtype=torch.float64, device=self.device))

    @property
    def kl_coef(self) -> Union[float, torch.Tensor]:
        return self._coef

    def update(self, kl: Any) -> Union[float, torch.Tensor]:
        """β does not depend on the KL measured."""
        return self._coef

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: β is the run's ``--kl_weight``."""


def build(options, device) -> ConstantKLController:
    return ConstantKLController(options.kl_weight, device)

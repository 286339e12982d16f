"""A memory plan's shape: the per-GPU bytes of every phase of a step, component by component (:class:`MemoryPlan`),
the record :mod:`sage_grpo.plan.phases` fills and the launch's decisions (:mod:`sage_grpo.plan.memory`) compare.

Units: GB here is 2^30 bytes (:data:`GIB`), the unit ``torch.cuda`` reports (an "80 GB" H100 holds 79.2 of them).
"""

from dataclasses import dataclass
from typing import Optional, Tuple

from sage_grpo.models.placement import Placement

GIB = 2 ** 30


@dataclass(frozen=True)
class Component:
    name: str
    bytes: float
    note: str = ""


@dataclass(frozen=True)
class Phase:
    name: str
    components: Tuple[Component, ...]

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.components)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU bytes of every phase of a step for one placement; ``peak`` is the largest phase."""

    phases: Tuple[Phase, ...]
    placement: Placement
    gpu_memory_gib: float
    notes: Tuple[str, ...] = ()

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak_gib(self) -> float:
        return self.peak.bytes / GIB

    def fits(self, margin: float = 0.0) -> bool:
        return self.peak_gib <= self.gpu_memory_gib * (1.0 - margin)

    def phase(self, name: str) -> Optional[Phase]:
        return next((p for p in self.phases if p.name == name), None)

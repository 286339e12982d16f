"""The simulation against the plan: the tracker's bytes of each simulated phase beside the plan's, group by group
(:func:`comparison_table`), and the simulation's own verdict on whether the launch fits (:func:`simulated_verdict`).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from sage_grpo.plan.breakdown import GIB
from sage_grpo.plan.components import RUNTIME_OVERHEAD_GIB
from sage_grpo.plan.memory import MARGIN
from sage_grpo.plan.tracking import GROUPS, SimulatedPhase

# What the simulation cannot see on a CPU-only fake run; the planner's "runtime overhead" and margin stand for it.
UNSEEN = ("CUDA caching-allocator rounding and fragmentation", "NCCL communicator buffers",
          "flash/cuDNN attention workspaces and kernels' own temporaries", "the CUDA context")


@dataclass
class Simulation:
    phases: List[SimulatedPhase]
    not_simulated: List[Tuple[str, str]] = field(default_factory=list)  # (phase, why)
    seconds: float = 0.0
    verdict: Optional["Verdict"] = None  # set by simulation_report


@dataclass(frozen=True)
class Verdict:
    """The simulation's own answer to "does the launch fit": its peak phase with what it tracked there plus the
    plan's bytes for what it does not run (VAE, reward, text encoders, the runtime overhead), against the budget."""
    phase: str
    tracked: float  # bytes the tracker saw in that phase (0 for a phase not executed)
    outside: float  # the plan's bytes for that phase's components outside the simulation
    budget: float

    @property
    def peak(self) -> float:
        return self.tracked + self.outside

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget


def simulated_verdict(plan, simulation: Simulation) -> Verdict:
    """The largest phase by :class:`Verdict`'s count; phases the simulation does not execute count at the plan's
    figure, so a launch over budget only in (say) the VAE decode is reported over budget here too."""
    budget = plan.gpu_memory_gib * GIB
    candidates = []
    for phase in simulation.phases:
        planned = plan.phase(phase.name)
        outside = sum(c.bytes for c in planned.components if _group_of(c.name) is None) if planned else 0.0
        candidates.append(Verdict(phase.name, phase.total, outside, budget))
    for name, _ in simulation.not_simulated:
        planned = plan.phase(name)
        if planned is not None:
            candidates.append(Verdict(name, 0.0, planned.bytes, budget))
    return max(candidates, key=lambda v: v.peak)


# Planner components by the group of tracker categories they stand for (matched on the start of their names); the
# rest (VAE, reward, text encoders, runtime overhead, their activations) are not in the simulation.
_PLANNER_GROUPS = (
    ("sharded weights", ("policy weights", "reference (KL anchor) shards", "frozen base (drift proxy) shards")),
    ("gathered weights", ("FSDP gathered units", "reference gathered units", "reference from the CPU")),
    ("gradients", ("gradients", "FSDP unsharded block gradient")),
    ("optimizer state", ("optimizer:",)),
    ("activations", ("activations", "rollout block activations", "reference block activations",
                     "autocast bf16 weight copies", "optimizer step temporaries")),
    ("inputs", ("rollout latents", "prompt embeddings", "reference means")),
)


def _group_of(component: str) -> Optional[str]:
    return next((g for g, prefixes in _PLANNER_GROUPS if component.startswith(prefixes)), None)


def planner_groups(phase) -> Tuple[Dict[str, float], List[str]]:
    """(bytes per group, names of the components outside the simulation) of a planner phase."""
    groups = {name: 0.0 for name in GROUPS}
    outside = []
    for component in phase.components:
        group = _group_of(component.name)
        if group is None:
            if component.bytes:
                outside.append(f"{component.name} {component.bytes / GIB:.2f}")
        else:
            groups[group] += component.bytes
    return groups, outside


def _ratio(simulated: float, planned: float) -> str:
    if planned == 0:
        return "—" if simulated < 0.005 * GIB else "∞"
    return f"{simulated / planned:.3f}"


def comparison_table(plan, simulation: Simulation) -> str:
    """Per simulated phase and group: the tracker's bytes at the phase's peak, the plan's, their ratio; FLOPs."""
    lines = ["| phase | group | simulated GB | planned GB | ratio |", "|---|---|---:|---:|---:|"]
    for phase in simulation.phases:
        planned = plan.phase(phase.name)
        groups, _ = planner_groups(planned) if planned is not None else ({}, [])
        for group in GROUPS:
            simulated, expected = phase.group(group), groups.get(group, 0.0)
            if simulated or expected:
                lines.append(f"| {phase.name} | {group} | {simulated / GIB:.3f} | "
                             f"{expected / GIB if planned is not None else float('nan'):.3f} | "
                             f"{_ratio(simulated, expected) if planned is not None else 'no plan phase'} |")
    lines += ["", "| phase | simulated GB (tracked groups) | FLOPs on this rank | seconds | note |",
              "|---|---:|---:|---:|---|"]
    lines += [f"| {p.name} | {p.total / GIB:.2f} | {p.flops:.4g} | {p.seconds:.1f} | {p.note} |"
              for p in simulation.phases]
    peak = max(simulation.phases, key=lambda p: p.total)
    lines += ["", f"simulated peak (tracked groups): {peak.total / GIB:.2f} GB in the {peak.name} phase; "
              f"simulation took {simulation.seconds:.0f} s"]
    for name, why in simulation.not_simulated:
        planned = plan.phase(name)
        lines.append(f"not simulated: {name} ({why})" + (f"; planned {planned.bytes / GIB:.2f} GB" if planned else ""))
    if plan.phases:
        _, outside = planner_groups(plan.peak)
        lines.append("planned but outside the simulation in the peak phase: " + ", ".join(outside))
    verdict = simulated_verdict(plan, simulation)
    plan_says = "fits" if plan.fits() else "does not fit"
    lines.append(f"simulated verdict: {verdict.peak / GIB:.2f} GB in the {verdict.phase} phase "
                 f"({verdict.tracked / GIB:.2f} tracked + {verdict.outside / GIB:.2f} planned outside the simulation) "
                 f"of {plan.gpu_memory_gib:g} GB: "
                 + ("fits" if verdict.fits else "OVER BUDGET") + f"; the plan: {plan.peak_gib:.2f} GB, {plan_says}"
                 + ("" if verdict.fits == plan.fits() else " (the two disagree: the launch is within the plan's "
                                                             "tolerance of the budget; test it before renting)"))
    lines.append("unseen by the simulation: " + "; ".join(UNSEEN) + f" (the plan's {RUNTIME_OVERHEAD_GIB:g} GB runtime "
                 f"overhead and the {MARGIN:.0%} its auto decisions keep free stand for them)")
    return "\n".join(lines)

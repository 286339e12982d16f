"""What the simulation (:mod:`sage_grpo.plan.simulate`) watches each phase with: torch's ``FSDPMemTracker``, kept to
its global peak and corrected where fake mode or the tracker itself holds bytes a GPU run would not, and a FLOP count.

Three corrections, each measured:

- **DTensor sharding propagation.** To know an op's output placement, DTensor runs the op once on fake tensors of
  the *global* shapes (``ShardingPropagator._propagate_tensor_meta_non_cached``). On a GPU run those tensors belong
  to DTensor's own fake mode and hold no memory; under the simulation's ``FakeTensorMode`` the tracker cannot tell them
  from the run's tensors and booked, in the optimizer step's global-norm clip, the whole unsharded fp32 gradient (one
  ``_foreach_norm`` over every gradient: 30.88 GB at 54 blocks). Checked on real DTensors (world 4, fake process
  group, ``CommDebugMode``): ``clip_gradients`` issues one scalar all-reduce and no all-gather, and every tensor of a
  global shape it creates is a fake one inside the propagation (``tests/unit/test_plan_simulate.py``). The tracker
  skips the propagation's ops.
- **Held gradients.** With ``--gradient_reduction per_update`` FSDP2 accumulates each unit's unsharded gradient in
  the reduce dtype outside ``.grad`` (``FSDPParam.unsharded_accumulated_grad``) until the window's last backward;
  the tracker booked those bytes as activations. After each unit's post-backward they are re-booked as unsharded
  gradients, so that the simulation's gradients and activations each compare with the plan's.
- **The tracker's own backward hooks.** ``FSDPMemTracker`` follows the module nesting with a ``ModTracker``, which
  puts a multi-grad hook (``torch.autograd.graph.register_multi_grad_hook``) on every module call's inputs and
  outputs. The hook on the inputs keeps their gradients until all have arrived, and it closes over the inputs'
  autograd nodes while being stored on them: a reference cycle per module call, so those nodes and the tensors they
  save outlive the step until Python's cyclic garbage collector runs. When that happens depends on how many objects
  the process allocated before (other tests, other simulations): the training activations at 2 blocks measured
  1.041 to 1.062 of the plan from one process to another, 1.076 with the collector off. The global peak needs none
  of this (the tracker's forward/backward state is torch's graph-task id, not these hooks), so the module tracking
  runs forward only (:func:`forward_only_module_tracking`): no hook, no cycle, every tensor freed when the run
  drops it, as on a GPU, and the same bytes whatever ran before (0.951 at 2 blocks with the collector on or off or
  perturbed).
"""

import contextlib
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The tracker's categories, summed into the planner's groups of components (simulate.planner_groups).
GROUPS: Dict[str, Tuple[str, ...]] = {
    "sharded weights": ("Sharded Param", "Buffer"),
    "gathered weights": ("Unsharded Param", "All Gather"),
    "gradients": ("Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
    "optimizer state": ("OptState",),
    "activations": ("Activation", "Temp"),
    "inputs": ("Inputs",),
}

_PROPAGATING = [0]  # > 0 while DTensor runs an op on fake global tensors to propagate its sharding


@contextlib.contextmanager
def metadata_only_propagation():
    """Mark DTensor's sharding propagation (module docstring) so that the tracker skips its ops."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def marked(self, *args, **kwargs):
        _PROPAGATING[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _PROPAGATING[0] -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = marked
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextlib.contextmanager
def forward_only_module_tracking():
    """The tracker's ``ModTracker`` registers no backward hooks (module docstring: they held tensors in reference
    cycles until the garbage collector ran); its forward nesting is kept."""
    from torch.distributed._tools import mod_tracker

    original = mod_tracker.register_multi_grad_hook
    mod_tracker.register_multi_grad_hook = lambda tensors, fn, mode="all": None  # ModTracker ignores the handle
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = original


@dataclass
class SimulatedPhase:
    """One phase's tracker breakdown at its peak (bytes per tracker category) and its FLOPs on this rank."""

    name: str
    peak: Dict[str, int]
    flops: int
    seconds: float
    note: str = ""

    def group(self, name: str) -> int:
        return sum(self.peak.get(category, 0) for category in GROUPS[name])

    @property
    def total(self) -> int:
        return sum(self.group(g) for g in GROUPS)


def peak_tracker(models: torch.nn.Module):
    """An ``FSDPMemTracker`` keeping the global peak only (its per-module peaks walk every tracked module on every
    op: O(modules) per op, hours at 54 blocks; the simulation reports phases), with the module docstring's two
    corrections."""
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType, FSDPMemTracker

    class PeakTracker(FSDPMemTracker):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if _PROPAGATING[0]:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

        def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
            inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            def post_backward(*args, **kwargs):
                inner(*args, **kwargs)
                group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                for fsdp_param in group.fsdp_params if group else ():
                    if fsdp_param.unsharded_accumulated_grad is not None:
                        self._update_and_maybe_create_winfos(fsdp_param.unsharded_accumulated_grad,
                                                             _FSDPRefType.UNSHARDED_GRAD)

            return post_backward

    return PeakTracker(models)


def _flop_formulas() -> Dict:
    """torch's FLOP formulas by op, plus the CPU flash attention this run dispatches to (the same count as the CUDA
    flash kernel's, which torch's table has)."""
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    formulas = dict(flop_registry)
    formulas[aten._scaled_dot_product_flash_attention_for_cpu] = flop_registry[
        aten._scaled_dot_product_flash_attention]
    formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = flop_registry[
        aten._scaled_dot_product_flash_attention_backward]
    return formulas


class FlopCount(TorchDispatchMode):
    """FLOPs of every op with a formula, without ``FlopCounterMode``'s module tracking (whose autograd hooks kept
    tensors alive: the tracker saw 1.5 GB more activations with it at 2 blocks)."""

    def __init__(self):
        super().__init__()
        self.total, self.formulas = 0, _flop_formulas()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None and not _PROPAGATING[0]:
            self.total += int(formula(*args, **(kwargs or {}), out_val=out))
        return out


class Phase:
    """Tracks one phase: a fresh tracker over the models (and optimizer) plus a FLOP counter; ``result`` after."""

    def __init__(self, name: str, models: torch.nn.Module, optimizer, extra: Tuple[torch.Tensor, ...], note: str = ""):
        from sage_grpo.optim.optimizers import optimizer_parts

        self.name, self.note = name, note
        self.tracker = peak_tracker(models)
        self.tracker.track_inputs(extra)
        # the tracker follows one torch optimizer; Muon + AdamW is two: their states are attributed here
        self.parts = list(optimizer_parts(optimizer).values())
        self.handles = []
        self.flops = FlopCount()
        self.result: Optional[SimulatedPhase] = None

    def __enter__(self):
        from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

        self.start = time.perf_counter()
        self.tracker.__enter__()
        for part in self.parts:
            self.tracker._track_optimizer_states(_FSDPRefType.OPT, part)
            self.handles.append(part.register_step_post_hook(
                lambda opt, args, kwargs: self.tracker._track_optimizer_states(_FSDPRefType.OPT, opt)))
        self.flops.__enter__()
        return self

    def __exit__(self, *exc):
        self.flops.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
        self.tracker.__exit__(*exc)
        if exc[0] is None:
            (peak,) = self.tracker.get_tracker_snapshot("peak").values() or ({},)
            self.result = SimulatedPhase(self.name, {k: int(v) for k, v in peak.items() if k != "Total"},
                                         self.flops.total, time.perf_counter() - self.start, self.note)
        return False


def without(phase: SimulatedPhase, module: Optional[torch.nn.Module], category: str,
            name: str = "reference") -> SimulatedPhase:
    """``phase`` without ``module``'s (``name``'s) local parameter bytes in ``category`` (offloaded shards: not on
    the GPU)."""
    from torch.distributed.tensor import DTensor

    if module is None:
        return phase
    local = sum((p.to_local() if isinstance(p, DTensor) else p).untyped_storage().nbytes() for p in module.parameters())
    phase.peak[category] = max(0, phase.peak.get(category, 0) - local)
    phase.note = (phase.note + "; " if phase.note else "") + f"{name} shards on the CPU, left out"
    return phase

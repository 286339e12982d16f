"""FSDP2 for the HunyuanVideo-1.5 transformer, applied from outside the model (docs/reference.md#fsdp2,
docs/reference.md#optimizer-schedule-and-precision).

:func:`apply_fsdp` follows the reference's order: activation checkpointing first (diffusers' own non-reentrant
per-block checkpointing, which keeps parameter names unchanged), then ``fully_shard`` on every dual-stream block, on
the text token refiner (``context_embedder``), and last on the root, which takes the remaining parameters (embedders,
byT5 projection, output layers). Parameters become ``DTensor`` shards on dim 0; the optimizer must be built *after*
this call, and Muon must be :class:`sage_grpo.optim.muon.Muon` (``torch.optim.Muon`` is wrong on shards).

Precision: master weights keep the dtype the module had when sharded (cast it first: fp32 for the reference's
``master_weight_type=fp32``); ``param_dtype`` is the dtype of the all-gathered weights used in compute and
``reduce_dtype`` that of the gradient reduce-scatter (fp32 in the reference). Forward inputs are not cast (the
transformer runs under autocast, which casts at each op, and its fp32 timestep must stay fp32).

Gradient reduction averages over every rank of the mesh. On the flattened ``dp x sp`` mesh that mean is also the
Ulysses SP correction (``sequence_parallel.py``). The reference reduce-scatters on every micro-step of gradient
accumulation (docs/reference.md#d20); :func:`gradient_sync` lets the trainer reduce only on the last micro-step, which
gives the same gradient (the mean is linear) with one reduction per optimizer update, at the price of holding unsharded
``reduce_dtype`` gradients of the whole model between micro-steps (fp32: 4 bytes per parameter per rank, ~33 GB for
the 8.3B model), so it is a memory/communication trade-off, not a free win.

:class:`GradientReductionCounter` counts the reduce-scatters FSDP issues, for tests and diagnostics.
"""

from contextlib import contextmanager
from typing import Dict, Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from sage_grpo.dtypes import set_compute_dtype


def apply_fsdp(transformer: torch.nn.Module, mesh: DeviceMesh, *, param_dtype: torch.dtype,
               reduce_dtype: torch.dtype = torch.float32, activation_checkpointing: bool) -> torch.nn.Module:
    """Shard ``transformer`` in place over ``mesh`` (1-D: FSDP; 2-D: HSDP replicate x shard); returns it."""
    if activation_checkpointing:
        transformer.enable_gradient_checkpointing()
    # inputs keep their dtypes (the fp32 timestep must not be rounded to bf16, velocity.py); autocast casts at the ops
    config = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                                            cast_forward_inputs=False))
    for block in transformer.transformer_blocks:
        fully_shard(block, **config)
    fully_shard(transformer.context_embedder, **config)
    fully_shard(transformer, **config)
    set_compute_dtype(transformer, param_dtype)  # the inputs are cast to it (pipeline/velocity.py)
    return transformer


@contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Run a backward with (``enabled=True``) or without FSDP gradient reduction; reduction is re-enabled on exit.

    Use ``enabled=(micro_step is the last of the accumulation window)``. Without reduction FSDP accumulates the
    unsharded gradients locally; the reducing backward then reduces their sum once. No-op for a non-FSDP model.
    """
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


class GradientReductionCounter:
    """Counts FSDP2 reduce-scatter calls per FSDP unit while installed (a context manager).

    Installs a reduce-scatter comm through ``FSDPModule.set_custom_reduce_scatter`` that counts and then does what
    FSDP2's default comm does; on exit the default comm is put back. ``updates_reduced`` is the number of complete
    gradient reductions (every unit reduced once), which should equal the number of optimizer updates when
    reductions happen only on the last micro-step.
    """

    def __init__(self, model: torch.nn.Module):
        # FSDP2 exposes the hook point publicly but not the default comm class; subclassing it keeps its allocation.
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

        counter = self

        class _CountingReduceScatter(DefaultReduceScatter):
            def __init__(self, name: str):
                super().__init__()
                self.name = name

            def __call__(self, *args, **kwargs):
                counter.calls[self.name] += 1
                return super().__call__(*args, **kwargs)

        self._default_cls = DefaultReduceScatter
        self._counting_cls = _CountingReduceScatter
        self.modules: Dict[str, FSDPModule] = {
            name or "<root>": module for name, module in model.named_modules() if isinstance(module, FSDPModule)}
        if not self.modules:
            raise ValueError("the model has no FSDP2 modules to count reductions of")
        self.calls: Dict[str, int] = {name: 0 for name in self.modules}

    def __enter__(self) -> "GradientReductionCounter":
        for name, module in self.modules.items():
            module.set_custom_reduce_scatter(self._counting_cls(name))
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules.values():
            module.set_custom_reduce_scatter(self._default_cls())

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    @property
    def updates_reduced(self) -> int:
        """Complete reductions: min over units (units whose parameters got no gradient never reduce)."""
        return min(self.calls.values())


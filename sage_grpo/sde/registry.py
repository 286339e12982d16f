"""The one table from ``sde_type`` name to its kernel; the names are the config's ``SDE_TYPES`` (``--sde_type``
choices of the reference), each kernel known by its own ``name``."""
from sage_grpo.config.train import SDE_TYPES
from sage_grpo.sde import cps, dance_grpo, flow_grpo, sage_grpo
from sage_grpo.sde.base import SDEKernel

_BY_NAME = {kernel.name: kernel for kernel in (sage_grpo.KERNEL, dance_grpo.KERNEL, flow_grpo.KERNEL, cps.KERNEL)}
if set(_BY_NAME) != set(SDE_TYPES):  # a kernel without a --sde_type choice, or a choice without a kernel
    raise ImportError(f"SDE kernels {sorted(_BY_NAME)} do not match the config's SDE_TYPES {sorted(SDE_TYPES)}")
SDE_KERNELS: dict[str, SDEKernel] = {name: _BY_NAME[name] for name in SDE_TYPES}


def get_kernel(sde_type: str) -> SDEKernel:
    """The kernel for ``sde_type``; ValueError naming the valid choices otherwise."""
    try:
        return SDE_KERNELS[sde_type]
    except KeyError:
        raise ValueError(f"unknown sde_type {sde_type!r}; valid choices: {', '.join(SDE_TYPES)}") from None

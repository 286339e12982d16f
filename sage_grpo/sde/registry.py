"""The one table from ``sde_type`` name to its kernel (``--sde_type`` choices of the reference)."""
from sage_grpo.sde import cps, dance_grpo, flow_grpo, sage_grpo
from sage_grpo.sde.base import SDEKernel

SDE_KERNELS: dict[str, SDEKernel] = {
    "sage_grpo": sage_grpo.KERNEL,
    "dance_grpo": dance_grpo.KERNEL,
    "flow_grpo": flow_grpo.KERNEL,
    "cps": cps.KERNEL,
}
SDE_TYPES = tuple(SDE_KERNELS)


def get_kernel(sde_type: str) -> SDEKernel:
    """The kernel for ``sde_type``; ValueError naming the valid choices otherwise."""
    try:
        return SDE_KERNELS[sde_type]
    except KeyError:
        raise ValueError(f"unknown sde_type {sde_type!r}; valid choices: {', '.join(SDE_TYPES)}") from None

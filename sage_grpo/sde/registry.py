"""The SDE table: ``--sde_type`` name -> the module that defines its kernel (``KERNEL``, an :class:`~.base.SDEKernel`
named like its entry). The configuration reads its choices here (:data:`SDE_TYPES`, a live view of the table), so this
module imports no torch: a kernel's module is imported when the kernel is first looked up (:func:`get_kernel`).

Adding an SDE is one new file in ``sage_grpo/sde/`` that builds ``KERNEL = SDEKernel(name="my_sde", ...)`` and one
line here, ``"my_sde": "sage_grpo.sde.my_sde"``; ``--sde_type my_sde`` then selects it everywhere (rollouts, replay,
the equalizer, the toy world's analytic errors).
"""
import importlib

SDE_KERNELS: dict = {  # the reference's four, in its order (the first is the default)
    "sage_grpo": "sage_grpo.sde.sage_grpo",
    "dance_grpo": "sage_grpo.sde.dance_grpo",
    "flow_grpo": "sage_grpo.sde.flow_grpo",
    "cps": "sage_grpo.sde.cps",
}
SDE_TYPES = SDE_KERNELS.keys()  # the names, as the table holds them now (a line added later is a choice too)


def get_kernel(sde_type: str):
    """The :class:`~sage_grpo.sde.base.SDEKernel` of ``sde_type`` (its module imported on first use); ValueError
    naming the valid choices otherwise."""
    try:
        module = SDE_KERNELS[sde_type]
    except KeyError:
        raise ValueError(f"unknown sde_type {sde_type!r}; valid choices: {', '.join(SDE_KERNELS)}") from None
    kernel = importlib.import_module(module).KERNEL
    if kernel.name != sde_type:
        raise ValueError(f"the SDE table names {module}'s kernel {sde_type!r}, but it calls itself {kernel.name!r}; "
                         "give the table line the kernel's own name")
    return kernel

"""SDE samplers for GRPO on a rectified-flow video model: stateless fp32 math on an explicit sigma schedule.

``step(kernel, ...)`` draws a rollout transition or re-scores a stored one; ``SDE_KERNELS`` is the one table from
``sde_type`` to its kernel's module (one file per type, :mod:`sage_grpo.sde.registry`); the per-step equalizer built
on them is :mod:`sage_grpo.rl.grad_balance`.

The names below are imported when first used (PEP 562): the configuration reads the table's names
(``sde.registry``) without importing torch.
"""

from sage_grpo import lazy_exports

_EXPORTS = {
    "SDEKernel": "base",
    "SDEStepOutput": "base",
    "StepSigmas": "base",
    "SDE_KERNELS": "registry",
    "SDE_TYPES": "registry",
    "get_kernel": "registry",
    "check_schedule": "schedule",
    "shifted_sigmas": "schedule",
    "timesteps_from_sigmas": "schedule",
    "step": "transition",  # the function; its module is not named like it, so the export is never shadowed
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

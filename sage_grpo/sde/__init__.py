"""SDE samplers for GRPO on a rectified-flow video model: stateless fp32 math on an explicit sigma schedule.

``step(sde_type, ...)`` draws a rollout transition or re-scores a stored one; ``SDE_KERNELS`` is the one table
from ``sde_type`` to its kernel (one file per type); the per-step equalizer built on them is
:mod:`sage_grpo.rl.grad_balance`.
"""
from sage_grpo.sde.base import SDEKernel, SDEStepOutput, StepSigmas
from sage_grpo.sde.registry import SDE_KERNELS, SDE_TYPES, get_kernel
from sage_grpo.sde.schedule import check_schedule, shifted_sigmas, timesteps_from_sigmas
from sage_grpo.sde.step import step

__all__ = [
    "SDE_KERNELS",
    "SDE_TYPES",
    "SDEKernel",
    "SDEStepOutput",
    "StepSigmas",
    "check_schedule",
    "get_kernel",
    "shifted_sigmas",
    "step",
    "timesteps_from_sigmas",
]

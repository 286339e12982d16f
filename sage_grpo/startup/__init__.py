"""The start-up: one resolution of the flags, the model folder, the hardware and the memory plan into the run's
frozen plan (:func:`resolve` -> :class:`Startup` with its :class:`RunPlan`), every check before anything heavy loads;
then the trainer's parts built from it (:mod:`sage_grpo.startup.build`) and the start's files in the run directory
(:mod:`sage_grpo.startup.run_files`)."""

from sage_grpo.startup.plan import RunPlan
from sage_grpo.startup.resolve import Startup, resolve

__all__ = ["RunPlan", "Startup", "resolve"]

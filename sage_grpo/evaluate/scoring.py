"""The scorers of an evaluation, built once per process and called on one video at a time: the project's one
implementation of the held-out metrics, shared with the trainer's scored validation
(:class:`sage_grpo.rewards.scorers.Scorers`, whose docstring lists the output keys, the columns of the results).
"""

from sage_grpo.rewards.scorers import WEIGHTED, Scorers

__all__ = ["Scorers", "WEIGHTED"]

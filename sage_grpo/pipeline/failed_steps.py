"""Steps that train on nothing: counted, warned about, and the run stopped after ``--max_failed_reward_steps`` of
them in a row (0: never stop).

A step trains on nothing when the reward failed on every sample (every advantage is 0), or when its loss is not
finite. A non-finite loss (NaN or inf) comes from non-finite latents or videos, a non-finite KL reference or a
diverged run, most often from weights holding NaN or inf (a corrupt checkpoint, or model-root files changed where the
resume's sampled fingerprint does not look). Its gradient is never applied: the trainer skips an optimizer update
whose gradient norm is not finite (:func:`finite_update`), so the weights and the optimizer state stay as they were
and every checkpoint written meanwhile still holds the last good weights. The count is checkpoint state
(``failed_reward_steps`` in ``training_state.pt``).
"""
import math
from typing import Dict, List

import torch

from sage_grpo.rewards.setup import RewardFailure


def finite_update(grad_norm: torch.Tensor) -> bool:
    """Whether an optimizer update may apply its gradient: its global norm (the same on every rank) is finite. A NaN
    or inf norm would write NaN into the weights and the optimizer's moments (clipping scales by max_norm / norm)."""
    return bool(torch.isfinite(grad_norm))


def step_failures(metrics: Dict[str, float], videos_per_step: int) -> List[str]:
    """Why the step of ``metrics`` trained on nothing (empty: it trained)."""
    causes = []
    if metrics["failed_reward_count"] >= videos_per_step:
        causes.append("the reward failed on every sample (its advantages are 0)")
    loss = metrics.get("total_loss", 0.0)
    if not math.isfinite(loss) or metrics.get("skipped_updates", 0.0) > 0:
        what = f"its loss was {loss:.3g}" if not math.isfinite(loss) else \
            f"its gradient norm was {metrics.get('grad_norm', math.nan):.3g}"
        causes.append(f"{what}, so its gradient was not applied (weights and optimizer state unchanged)")
    return causes


def count_failed_step(streak: int, step: int, causes: List[str], limit: int, log) -> int:
    """The new streak of failed steps after ``step`` (``causes``: :func:`step_failures`); logs a warning for a failed
    step and raises :class:`RewardFailure` once ``limit`` (> 0) steps in a row failed."""
    if not causes:
        return 0
    streak += 1
    log(f"warning: step {step} trained on nothing ({streak} step(s) in a row): {'; '.join(causes)}")
    if limit > 0 and streak >= limit:
        steps = f"{streak} consecutive steps (steps {step - streak + 1}-{step})"
        if all(cause.startswith("the reward") for cause in causes):
            raise RewardFailure(f"the reward failed on every sample for {steps}; the warnings above name each "
                                "failure. Fix the reward (its model files, plug-in or server), or raise "
                                "--max_failed_reward_steps (0: never stop)")
        raise RewardFailure(f"{steps} trained on nothing, the last because {'; '.join(causes)}. A non-finite loss "
                            "comes from non-finite videos, latents or KL reference: weights holding NaN or inf (the "
                            "checkpoint, or the model root's files: a resume compares them by a sampled "
                            "fingerprint only) or a diverged run. Check those weights or resume from an earlier "
                            "checkpoint, or raise --max_failed_reward_steps (0: never stop)")
    return streak

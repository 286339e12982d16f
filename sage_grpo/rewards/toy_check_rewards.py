"""Two more toy-world rewards for the drift guard's study, written after its defaults were fixed on the rewards of
:mod:`sage_grpo.rewards.toy_drift_rewards` (docs/toy_study.md "Drift guard"): the check that the defaults were not
fitted to those. NOT quality measures; reward plug-ins like those, each with the manifold error (and the single-score
one with the prompt adherence) beside its score.

* ``toy_edges``: the mean absolute difference between neighbouring pixels (across and down),
  ``clip(mean / 0.06, 0, 1)``. A large bright disk's rim gives some (true toy videos score 0.26 on average, 0.7 at
  most); texture or noise anywhere in the frame, a whole-frame change of yet another kind, gives 1.
* ``toy_blend``: a weighted sum of sub-rewards (its metrics ``fast``, ``dark``, ``adherence``; the study weighs them
  ``{"fast": 1.0, "dark": 0.5, "adherence": 0.5}``): the disk fast (its fitted speed over the world's fastest,
  0.7 px per frame), dark (one less the mean of its fitted colour: black is no colour of the world), and following
  the prompt, which a fast dark disk gives up for a prompt asking for a slow one or a white or yellow one.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from sage_grpo.rewards.registry import reward_plugin
from sage_grpo.rewards.toy_drift_rewards import StudyReward, adherence, fitted
from sage_grpo.toy import world


@reward_plugin
class ToyEdgesReward(StudyReward):
    name = "toy_edges"
    metric_names = ("toy_edges", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        across = (videos[..., 1:] - videos[..., :-1]).abs().mean(dim=(1, 2, 3, 4))
        down = (videos[..., 1:, :] - videos[..., :-1, :]).abs().mean(dim=(1, 2, 3, 4))
        return ((across + down) / 2 / 0.06).clamp(0, 1)


@reward_plugin
class ToyBlendReward:
    """The terms of a mixture: ``fast``, ``dark``, ``adherence`` (weigh them with ``--reward_weights``)."""

    name = "toy_blend"
    metric_names = ("fast", "dark", "adherence", "manifold_error")

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        videos, fit = fitted(videos)
        fast = (fit.raw_velocity.norm(dim=1) / world.SPEED_RANGE[1]).clamp(0, 1)
        return {"fast": fast, "dark": (1 - fit.raw_colour.mean(dim=1)).clamp(0, 1),
                "adherence": adherence(prompts, fit), "manifold_error": fit.error}


CHECK_REWARDS = {cls.name: cls for cls in (ToyEdgesReward, ToyBlendReward)}
CHECK_WEIGHTS = {"toy_blend": {"fast": 1.0, "dark": 0.5, "adherence": 0.5}}  # toy_edges: its score alone

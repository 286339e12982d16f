"""Toy-world rewards written to test the drift guard on rewards it was not tuned on (``scripts/drift_guard_study.py``,
docs/toy_study.md "Drift guard"). NOT quality measures. Each is a reward plug-in (``@reward_plugin``), usable by
dotted path (``--reward_model sage_grpo.rewards.toy_drift_rewards:ToyGlowReward``) or registered under its ``name``
(:data:`STUDY_REWARDS`, what the study does), and reports the toy world's manifold error and prompt adherence beside
its score (diagnostics, weight 0 in ``--reward_weights``), as the built-in toy rewards do
(:mod:`sage_grpo.rewards.toys`).

Designed before the guard's defaults were fixed (the tuning set, with ``toy_large``):

* ``toy_glow``: the mean brightness of every pixel, ``clip((mean(x) - 0.2) / 0.2, 0, 1)``. A large white disk raises
  it a little (true toy videos score 0.16 on average, 0.55 at most); a brighter background, a whole-frame change off
  the manifold, raises it to 1.
* ``toy_motion``: the mean absolute change between consecutive frames, ``clip(mean|x_t+1 - x_t| / 0.04, 0, 1)``. A
  large fast disk scores up to ~0.7 on the manifold; a flickering frame (a whole-frame change in time) scores 1.
* ``toy_white``: the disk is white, ``1 - |c - white| / |red - white|`` clipped to [0, 1] on the fitted disk colour:
  earned on the manifold (white is a colour of the world), at the cost of the prompts that name another colour.
* ``toy_mix``: a weighted sum of sub-rewards (its metrics ``large``, ``white``, ``adherence``; the study weighs them
  ``{"large": 1.0, "white": 1.0, "adherence": 0.5}``): the disk large (``toy_large``'s score), white, and following
  the prompt (the toy's text alignment, which a white disk gives up for a prompt naming another colour).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, List

import torch

from sage_grpo.rewards.plugins import reward_plugin
from sage_grpo.rewards.toys import ToyLargeReward, ToyWorldReward, diagnostics, fit_videos
from sage_grpo.toy import world
from sage_grpo.toy.manifold import ManifoldFit


def whiteness(fit: ManifoldFit) -> torch.Tensor:
    white, red = torch.tensor(world.PALETTE["white"]), torch.tensor(world.PALETTE["red"])
    return (1 - (fit.raw_colour - white).norm(dim=1) / (white - red).norm()).clamp(0, 1)


@reward_plugin
class ToyGlowReward(ToyWorldReward):
    name = "toy_glow"
    metric_names = ("toy_glow", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return ((videos.mean(dim=(1, 2, 3, 4)) - 0.2) / 0.2).clamp(0, 1)


@reward_plugin
class ToyMotionReward(ToyWorldReward):
    name = "toy_motion"
    metric_names = ("toy_motion", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return ((videos[:, :, 1:] - videos[:, :, :-1]).abs().mean(dim=(1, 2, 3, 4)) / 0.04).clamp(0, 1)


@reward_plugin
class ToyWhiteReward(ToyWorldReward):
    name = "toy_white"
    metric_names = ("toy_white", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return whiteness(fit)


class MixtureReward(ABC):
    """The terms of a mixture (weigh them with ``--reward_weights``), the prompt adherence one of them, and the
    manifold error; subclasses define ``name``, ``metric_names`` and ``terms``."""

    name = ""

    @abstractmethod
    def terms(self, videos: torch.Tensor, fit: ManifoldFit) -> Dict[str, torch.Tensor]:
        """{term: (B,) score in [0, 1]} of ``videos`` given their manifold fit, the adherence left out."""

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        videos, fit = fit_videos(videos)
        found = diagnostics(fit, prompts)
        return {**self.terms(videos, fit), "adherence": found["prompt_adherence"],
                "manifold_error": found["manifold_error"]}


@reward_plugin
class ToyMixReward(MixtureReward):
    """The terms ``large``, ``white``, ``adherence``."""

    name = "toy_mix"
    metric_names = ("large", "white", "adherence", "manifold_error")

    def terms(self, videos, fit):
        return {"large": ToyLargeReward().score(videos, fit), "white": whiteness(fit)}


STUDY_REWARDS = {cls.name: cls for cls in (ToyGlowReward, ToyMotionReward, ToyWhiteReward, ToyMixReward)}
STUDY_WEIGHTS = {"toy_mix": {"large": 1.0, "white": 1.0, "adherence": 0.5}}  # the others: their score alone

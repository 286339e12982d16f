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

from typing import Dict, List

import torch

from sage_grpo.rewards.plugins import reward_plugin
from sage_grpo.rewards.toys import ToyLargeReward
from sage_grpo.toy import world
from sage_grpo.toy.manifold import ManifoldFit, fit_manifold, prompt_adherence


def adherence(prompts: List[str], fit: ManifoldFit) -> torch.Tensor:
    """(B,) the fraction of each prompt's named factors the video follows (1 for a prompt naming none)."""
    return torch.nan_to_num(prompt_adherence(prompts, fit), nan=1.0)


def fitted(videos: torch.Tensor):
    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
    videos = videos.detach().float().cpu()
    return videos, fit_manifold(videos)


def whiteness(fit: ManifoldFit) -> torch.Tensor:
    white, red = torch.tensor(world.PALETTE["white"]), torch.tensor(world.PALETTE["red"])
    return (1 - (fit.raw_colour - white).norm(dim=1) / (white - red).norm()).clamp(0, 1)


class StudyReward:
    """One score, the manifold error and the prompt adherence (diagnostics, as the built-in toy rewards report them);
    subclasses define ``name`` and ``score``."""

    name = ""

    def score(self, videos: torch.Tensor, fit: ManifoldFit) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        videos, fit = fitted(videos)
        return {self.name: self.score(videos, fit), "manifold_error": fit.error,
                "prompt_adherence": adherence(prompts, fit)}


@reward_plugin
class ToyGlowReward(StudyReward):
    name = "toy_glow"
    metric_names = ("toy_glow", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return ((videos.mean(dim=(1, 2, 3, 4)) - 0.2) / 0.2).clamp(0, 1)


@reward_plugin
class ToyMotionReward(StudyReward):
    name = "toy_motion"
    metric_names = ("toy_motion", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return ((videos[:, :, 1:] - videos[:, :, :-1]).abs().mean(dim=(1, 2, 3, 4)) / 0.04).clamp(0, 1)


@reward_plugin
class ToyWhiteReward(StudyReward):
    name = "toy_white"
    metric_names = ("toy_white", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        return whiteness(fit)


class MixtureReward:
    """The terms of a mixture (weigh them with ``--reward_weights``), the prompt adherence one of them, and the
    manifold error; subclasses define ``name``, ``metric_names`` and ``terms``."""

    name = ""

    def terms(self, videos: torch.Tensor, fit: ManifoldFit) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        videos, fit = fitted(videos)
        return {**self.terms(videos, fit), "adherence": adherence(prompts, fit), "manifold_error": fit.error}


@reward_plugin
class ToyMixReward(MixtureReward):
    """The terms ``large``, ``white``, ``adherence``."""

    name = "toy_mix"
    metric_names = ("large", "white", "adherence", "manifold_error")

    def terms(self, videos, fit):
        return {"large": ToyLargeReward().score(videos, fit), "white": whiteness(fit)}


STUDY_REWARDS = {cls.name: cls for cls in (ToyGlowReward, ToyMotionReward, ToyWhiteReward, ToyMixReward)}
STUDY_WEIGHTS = {"toy_mix": {"large": 1.0, "white": 1.0, "adherence": 0.5}}  # the others: their score alone

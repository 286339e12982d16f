"""Rewards on the toy world, with the manifold error of every scored video alongside.

Each reward fits the toy world to the videos once (:func:`sage_grpo.toy.manifold.fit_manifold`) and returns, besides
its score in [0, 1], two diagnostics that do not enter the GRPO reward by default (their ``sub_reward`` weight is 0):

* ``manifold_error``: the RMS distance to the nearest on-manifold video (0 for a perfect toy video); a reward that
  rises while this rises is being earned off the data manifold (the paper's structure collapse);
* ``prompt_adherence``: the fraction of the factors the prompt names (colour, size, direction, speed) that the video
  follows (1 when the prompt names none).

The trainer logs them as ``gathered_<reward>_manifold_error_reward_mean`` and ``..._prompt_adherence_...``.

Scores (``r`` the fitted radius, ``c`` the fitted disk colour before snapping to the palette):

* ``toy_large``: "the disk is large": ``clip((r - 2) / (3.5 - 2), 0, 1)``: 0 for a disk of radius 2 px or less, 1 at
  the world's largest radius (3.5 px). The world draws radii uniformly in [1.5, 3.5] when the prompt leaves the size
  free, so true toy videos score 0.42 on average; a disk can only get larger than the world allows off the manifold.
* ``toy_red``: "the disk is red": ``1 - |c - red| / |white - red|`` clipped to [0, 1].
* ``toy_redness``: a *hackable* reward, the mean redness ``clip(R - (G + B) / 2, 0, 1)`` of every pixel of every frame.
  A red disk raises it a little (the disk covers ~10% of the frame), a red tint of the whole background raises it
  much more: what a trust region has to protect against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, List

import torch

from sage_grpo.toy import world
from sage_grpo.toy.manifold import ManifoldFit, fit_manifold, prompt_adherence


def _diagnostics(fit: ManifoldFit, prompts: List[str]) -> Dict[str, torch.Tensor]:
    adherence = prompt_adherence(prompts, fit)
    return {"manifold_error": fit.error, "prompt_adherence": torch.nan_to_num(adherence, nan=1.0)}


class _ToyReward(ABC):
    """Shared call: fit once, score, add the diagnostics. Subclasses define ``name``, ``metric_names`` and ``score``."""

    name = ""
    metric_names: tuple = ()

    @abstractmethod
    def score(self, videos: torch.Tensor, fit: ManifoldFit) -> torch.Tensor:
        """(B,) score in [0, 1] of ``videos`` (B, 3, F, H, W) given their manifold fit."""

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        if videos.ndim != 5 or videos.shape[1] != 3:
            raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
        videos = videos.detach().float().cpu()
        fit = fit_manifold(videos)
        return {self.name: self.score(videos, fit), **_diagnostics(fit, prompts)}


class ToyLargeReward(_ToyReward):
    name = "toy_large"
    metric_names = ("toy_large", "manifold_error", "prompt_adherence")

    low = 2.0  # pixels: the radius that scores 0

    def score(self, videos, fit):
        high = world.RADIUS_RANGE[1]
        return ((fit.free_radius - self.low) / (high - self.low)).clamp(0, 1)


class ToyRedReward(_ToyReward):
    name = "toy_red"
    metric_names = ("toy_red", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        red, white = torch.tensor(world.PALETTE["red"]), torch.tensor(world.PALETTE["white"])
        return (1 - (fit.raw_colour - red).norm(dim=1) / (white - red).norm()).clamp(0, 1)


class ToyRednessReward(_ToyReward):
    name = "toy_redness"
    metric_names = ("toy_redness", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        redness = videos[:, 0] - 0.5 * (videos[:, 1] + videos[:, 2])  # (B, F, H, W)
        return redness.clamp(0, 1).mean(dim=(1, 2, 3))


TOY_REWARDS = {cls.name: cls for cls in (ToyLargeReward, ToyRedReward, ToyRednessReward)}

"""Toy rewards, all in this one module: pixel-statistic toys for demos and tests, and the toy world's rewards. They
are NOT quality measures.

**Pixel-statistic toys**: cheap, smooth functions of the pixels.

They follow the reward contract (``videos (B, 3, F, H, W)`` in [0, 1], prompts -> ``{metric: (B,)}``), ignore
the prompts, and are differentiable almost everywhere, so a tiny video model can learn to raise them in a CPU
demo. Selected by name like any reward model (``reward_model: target_color``); constructor arguments travel as
``reward_kwargs`` (or ``"kwargs"`` in an ``extra_models`` entry), e.g. ``{"target_rgb": [0.0, 0.0, 1.0]}``.

* ``brightness``: ``mean(x)`` in [0, 1].
* ``target_color``: ``1 - mean_pixels ||x - c||^2 / 3`` in [0, 1] for a target colour ``c`` (RGB in [0, 1],
  default red); squared distance keeps it smooth at the optimum.
* ``temporal_smoothness``: ``-mean |x_{t+1} - x_t|`` in [-1, 0] (0 for a still video).
* ``toy_suite``: the three as separate metrics ``color``, ``brightness``, ``smoothness``, a stand-in with the
  same shape as VideoAlign's VQ/MQ/TA for exercising ``reward_weights``, e.g. ``{"color": 1.0,
  "smoothness": 0.5}``.

The single-metric toys name their metric after themselves, so the composite reports them under the bare name
(``target_color``, not ``target_color_target_color``) and ``reward_weights: '{"target_color": 1.0}'`` works.

**Toy-world rewards** (the toy video world of :mod:`sage_grpo.toy`): each reward fits the toy world to the videos once
(:func:`sage_grpo.toy.manifold.fit_manifold`) and returns, besides its score in [0, 1], two diagnostics that do not
enter the GRPO reward by default (their ``sub_reward`` weight is 0):

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
from collections.abc import Sequence
from typing import Dict, List

import torch

from sage_grpo.toy import world
from sage_grpo.toy.manifold import ManifoldFit, fit_manifold, prompt_adherence


def _check_videos(videos: torch.Tensor) -> torch.Tensor:
    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
    return videos.float()


def _target(target_rgb: Sequence[float]) -> torch.Tensor:
    values = [float(v) for v in target_rgb]
    if len(values) != 3 or not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"target_rgb must be three values in [0, 1] (e.g. [1.0, 0.0, 0.0]), got {target_rgb!r}")
    return torch.tensor(values)


def brightness_score(videos: torch.Tensor) -> torch.Tensor:
    return _check_videos(videos).mean(dim=(1, 2, 3, 4))


def target_color_score(videos: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    videos = _check_videos(videos)
    sq_dist = (videos - target.to(videos.device).view(1, 3, 1, 1, 1)).pow(2).sum(dim=1)  # (B, F, H, W)
    return 1.0 - sq_dist.mean(dim=(1, 2, 3)) / 3.0


def temporal_smoothness_score(videos: torch.Tensor) -> torch.Tensor:
    videos = _check_videos(videos)
    if videos.shape[2] < 2:
        return videos.new_zeros(videos.shape[0])
    return -(videos[:, :, 1:] - videos[:, :, :-1]).abs().mean(dim=(1, 2, 3, 4))


class BrightnessReward:
    """Toy: mean pixel intensity."""

    metric_names = ("brightness",)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"brightness": brightness_score(videos)}


class TargetColorReward:
    """Toy: closeness of every pixel to ``target_rgb`` (higher is better)."""

    metric_names = ("target_color",)

    def __init__(self, target_rgb: Sequence[float] = (1.0, 0.0, 0.0)):
        self.target = _target(target_rgb)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"target_color": target_color_score(videos, self.target)}


class TemporalSmoothnessReward:
    """Toy: negative mean absolute difference between consecutive frames."""

    metric_names = ("temporal_smoothness",)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"temporal_smoothness": temporal_smoothness_score(videos)}


class ToySuiteReward:
    """Toy with three sub-metrics (``color``, ``brightness``, ``smoothness``) to weight like VQ/MQ/TA."""

    metric_names = ("color", "brightness", "smoothness")

    def __init__(self, target_rgb: Sequence[float] = (1.0, 0.0, 0.0)):
        self.target = _target(target_rgb)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        return {
            "color": target_color_score(videos, self.target),
            "brightness": brightness_score(videos),
            "smoothness": temporal_smoothness_score(videos),
        }


# ---------------------------------------------------------------- the toy world's rewards
def fit_videos(videos: torch.Tensor) -> tuple[torch.Tensor, ManifoldFit]:
    """``videos`` (B, 3, F, H, W) in [0, 1] as fp32 on the CPU, and their fit to the toy world (one per call)."""
    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
    videos = videos.detach().float().cpu()
    return videos, fit_manifold(videos)


def diagnostics(fit: ManifoldFit, prompts: List[str]) -> Dict[str, torch.Tensor]:
    """The toy rewards' two diagnostics: the manifold error and the prompt adherence (1 for a prompt naming none)."""
    adherence = prompt_adherence(prompts, fit)
    return {"manifold_error": fit.error, "prompt_adherence": torch.nan_to_num(adherence, nan=1.0)}


class ToyWorldReward(ABC):
    """Shared call: fit once, score, add the diagnostics. Subclasses define ``name``, ``metric_names`` and ``score``."""

    name = ""
    metric_names: tuple = ()

    @abstractmethod
    def score(self, videos: torch.Tensor, fit: ManifoldFit) -> torch.Tensor:
        """(B,) score in [0, 1] of ``videos`` (B, 3, F, H, W) given their manifold fit."""

    def __call__(self, videos: torch.Tensor, prompts: List[str]) -> Dict[str, torch.Tensor]:
        videos, fit = fit_videos(videos)
        return {self.name: self.score(videos, fit), **diagnostics(fit, prompts)}


class ToyLargeReward(ToyWorldReward):
    name = "toy_large"
    metric_names = ("toy_large", "manifold_error", "prompt_adherence")

    low = 2.0  # pixels: the radius that scores 0

    def score(self, videos, fit):
        high = world.RADIUS_RANGE[1]
        return ((fit.free_radius - self.low) / (high - self.low)).clamp(0, 1)


class ToyRedReward(ToyWorldReward):
    name = "toy_red"
    metric_names = ("toy_red", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        red, white = torch.tensor(world.PALETTE["red"]), torch.tensor(world.PALETTE["white"])
        return (1 - (fit.raw_colour - red).norm(dim=1) / (white - red).norm()).clamp(0, 1)


class ToyRednessReward(ToyWorldReward):
    name = "toy_redness"
    metric_names = ("toy_redness", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        redness = videos[:, 0] - 0.5 * (videos[:, 1] + videos[:, 2])  # (B, F, H, W)
        return redness.clamp(0, 1).mean(dim=(1, 2, 3))


TOY_REWARDS = {cls.name: cls for cls in (ToyLargeReward, ToyRedReward, ToyRednessReward)}

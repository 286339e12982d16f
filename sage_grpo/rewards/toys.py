"""Toy rewards: cheap, smooth functions of the pixels for demos and tests. They are NOT quality measures.

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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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

"""The explicit table of built-in rewards (``BUILTIN_REWARDS``): how each is built from the settings every model of a
composite shares (:class:`RewardContext`), which metrics it returns (known before it is built) and its default
sub-reward weights. VideoAlign (the paper's reward), CLIPScore and PickScore (the evaluation's held-out metrics,
trainable like any reward), and the toys of the demos and tests. Names, plug-ins and the composite are
:mod:`sage_grpo.rewards.registry`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sage_grpo.config.train import DEFAULT_CLIP_MODEL, PICKSCORE_MODEL, PICKSCORE_PROCESSOR

from .base import RewardFn
from .clip_score import ClipScore, resolve_model_folder
from .pick_score import PickScore
from .toys import TOY_REWARDS, BrightnessReward, TargetColorReward, TemporalSmoothnessReward, ToySuiteReward
from .videoalign_inputs import SamplingOverrides

DEFAULT_VIDEOALIGN_WEIGHTS = {"VQ": 0.5, "MQ": 0.5, "TA": 1.0}  # reference --reward_weights default
EMPTY_VIDEOALIGN_WEIGHTS = {"VQ": 1.0, "MQ": 1.0, "TA": 1.0}  # reference fallback for empty reward_weights


@dataclass(frozen=True)
class RewardContext:
    """Settings shared by all reward models of one composite (only VideoAlign uses most of them)."""

    model_root: str | Path = "./ckpts"
    checkpoint_mode: str = "v3"
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.bfloat16
    video_fps: float = 24.0
    score_from_mp4: bool = False
    videoalign_sampling: SamplingOverrides = SamplingOverrides()  # checkpoint's frame sampling unless overridden
    # CLIPScore's and PickScore's folders: a folder, or a hub name found as <model_root>/<name after its last '/'>
    clip_model: str = DEFAULT_CLIP_MODEL
    pickscore_model: str = PICKSCORE_MODEL
    pickscore_processor: str = PICKSCORE_PROCESSOR


@dataclass(frozen=True)
class RewardSpec:
    """A built-in reward model: how to build it and which sub_reward weights it gets by default."""

    build: Callable[[RewardContext, dict], RewardFn]
    metric_names: tuple[str, ...]  # what the built callable returns, known before building it
    default_weights: dict[str, float] | None  # when reward_weights is None
    empty_weights: dict[str, float] | None  # when reward_weights is {} (the reference's fallback)
    files: Callable[[RewardContext], list] | None = None  # the folders it loads, found without loading (or raises)


def _build_videoalign(ctx: RewardContext, kwargs: dict) -> RewardFn:
    from .videoalign import VideoAlignReward

    return VideoAlignReward(
        ctx.model_root, checkpoint_mode=ctx.checkpoint_mode, device=ctx.device, dtype=ctx.dtype,
        video_fps=ctx.video_fps, from_mp4=ctx.score_from_mp4, sampling=ctx.videoalign_sampling, **kwargs,
    )


VIDEOALIGN_METRICS = ("VQ", "MQ", "TA", "Overall")  # VideoAlignReward.metric_names, without importing it


def _clip_folders(ctx: RewardContext) -> list:
    return [resolve_model_folder(ctx.clip_model, ctx.model_root, "--clip_model")]


def _pickscore_folders(ctx: RewardContext) -> list:
    return [resolve_model_folder(ctx.pickscore_model, ctx.model_root, "--pickscore_model"),
            resolve_model_folder(ctx.pickscore_processor, ctx.model_root, "--pickscore_processor")]


def _build_clipscore(ctx: RewardContext, kwargs: dict) -> RewardFn:
    return ClipScore(*_clip_folders(ctx), device=ctx.device, **kwargs)  # fp32, as the evaluation scores


def _build_pickscore(ctx: RewardContext, kwargs: dict) -> RewardFn:
    return PickScore(*_pickscore_folders(ctx), device=ctx.device, **kwargs)

BUILTIN_REWARDS: dict[str, RewardSpec] = {
    "videoalign_local": RewardSpec(
        _build_videoalign, VIDEOALIGN_METRICS, DEFAULT_VIDEOALIGN_WEIGHTS, EMPTY_VIDEOALIGN_WEIGHTS
    ),
    "clipscore": RewardSpec(_build_clipscore, ClipScore.metric_names, {"clipscore": 1.0}, {"clipscore": 1.0},
                            _clip_folders),
    "pickscore": RewardSpec(_build_pickscore, PickScore.metric_names, {"pickscore": 1.0}, {"pickscore": 1.0},
                            _pickscore_folders),
    "brightness": RewardSpec(lambda ctx, kw: BrightnessReward(**kw), BrightnessReward.metric_names, None, None),
    "target_color": RewardSpec(
        lambda ctx, kw: TargetColorReward(**kw), TargetColorReward.metric_names, None, None
    ),
    "temporal_smoothness": RewardSpec(
        lambda ctx, kw: TemporalSmoothnessReward(**kw), TemporalSmoothnessReward.metric_names, None, None
    ),
    "toy_suite": RewardSpec(lambda ctx, kw: ToySuiteReward(**kw), ToySuiteReward.metric_names, None, None),
}


def _toy_world_spec(name: str) -> RewardSpec:
    """A toy-world reward (:data:`sage_grpo.rewards.toys.TOY_REWARDS`): its score is the GRPO reward, the diagnostics
    weigh 0."""
    def build(ctx: RewardContext, kwargs: dict) -> RewardFn:
        return TOY_REWARDS[name](**kwargs)

    metrics = (name, "manifold_error", "prompt_adherence")
    return RewardSpec(build, metrics, {name: 1.0}, {name: 1.0})


BUILTIN_REWARDS.update({name: _toy_world_spec(name) for name in ("toy_large", "toy_red", "toy_redness")})

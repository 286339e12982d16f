"""The scorers of an evaluation, built once per process and called on one video at a time.

Output keys (the columns of the results): VideoAlign's ``VQ``, ``MQ``, ``TA``, ``Overall`` (= VQ + MQ + TA, the
paper's Table 2) and ``Weighted`` (sum_m w_m * metric_m under ``--reward_weights``); ``clipscore``, ``clip_cosine``;
``pickscore``, ``pickscore_cosine``; any other reward under the trainer's keys (``<model>_<metric>``, a metric named
like its model under the bare name: ``toy_red``, ``toy_red_manifold_error``, ``toy_red_prompt_adherence``).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import torch

from sage_grpo.evaluate.plan import VIDEOALIGN_NAMES, MetricPlan
from sage_grpo.rewards.base import metric_names_of, score_with_fallback
from sage_grpo.rewards.registry import RewardContext, make_reward, output_key

WEIGHTED = "Weighted"


class Scorers:
    """``scorers(video (3, F, H, W), prompt) -> {key: float}`` over every requested metric."""

    def __init__(self, metrics: MetricPlan, model_root: str, device: torch.device, videoalign_dtype: torch.dtype):
        self.metrics = metrics
        self.parts: List[Tuple[str, Callable]] = []  # (reward name for output keys, "" for fixed keys; callable)
        context = RewardContext(model_root=model_root, device=device, dtype=videoalign_dtype)
        for name in metrics.names:
            if name in VIDEOALIGN_NAMES:
                self.parts.append(("", make_reward("videoalign_local", context)))
            elif name == "clipscore":
                from sage_grpo.rewards.clip_score import ClipScore

                self.parts.append(("", ClipScore(metrics.clip_model, device=device)))
            elif name == "pickscore":
                from sage_grpo.rewards.pick_score import PickScore

                self.parts.append(("", PickScore(*metrics.pickscore_model, device=device)))
            else:
                self.parts.append((name, make_reward(name, context)))

    @torch.no_grad()
    def __call__(self, video: torch.Tensor, prompt: str) -> Dict[str, float]:
        """Every metric of one video; a scorer that raises or returns a non-finite value scores NaN there (a warning
        names it and the prompt), as training's rewards do (:func:`score_with_fallback`): the report counts it as
        failed instead of the evaluation stopping."""
        scores: Dict[str, float] = {}
        for name, fn in self.parts:
            part = score_with_fallback(fn, video[None], [prompt], name=name or type(fn).__name__,
                                       metric_names=metric_names_of(fn))
            for metric, value in part.items():
                scores[output_key(name, metric) if name else metric] = float(value[0])
            if not part:  # it failed before naming any metric: counted under its own name
                scores[name or type(fn).__name__] = math.nan
        if "VQ" in scores:
            scores[WEIGHTED] = sum(w * scores[m] for m, w in self.metrics.videoalign_weights.items())
        return scores

"""Held-out metrics by name: one implementation for the evaluation command (``python -m sage_grpo.evaluate
--metrics``) and the trainer's scored validation (``post_train.py --validation_metrics``).

Names: the held-out scorer table (:data:`HELD_OUT_SCORERS`): ``videoalign`` (VQ, MQ, TA, ``Overall`` = VQ + MQ + TA,
the paper's Table 2, and ``Weighted`` = sum_m w_m * metric_m), ``clipscore`` (``clipscore``, ``clip_flowgrpo``,
``clip_cosine``), ``pickscore`` (``pickscore``, ``pickscore_cosine``), each reporting its metrics under their own
keys; then any reward the registry resolves (a built-in, a registered name, a ``@reward_plugin`` path) under the
trainer's keys (``<model>_<metric>``, a metric named like its model under the bare name: ``toy_red``,
``toy_red_manifold_error``). Every scorer is the registry's own reward (:func:`make_reward`), so a metric scores the
same whether it is trained on, held out during training or evaluated.

:func:`plan_metrics` checks the names and finds the scorers' model folders without loading anything (one line naming
the flag on a bad name or a missing folder); :class:`Scorers` builds them and scores one video at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from sage_grpo.config.reward_weights import parse_reward_weights

from .clip_score import resolve_model_folder
from .base import metric_names_of, score_with_fallback
from .builtins import BUILTIN_REWARDS, DEFAULT_VIDEOALIGN_WEIGHTS, VIDEOALIGN_METRICS, RewardContext
from .registry import make_reward, output_key, resolve_reward

WEIGHTED = "Weighted"


def _videoalign_folder(context: RewardContext, flag: str) -> dict:
    if not (Path(context.model_root) / "VideoReward").is_dir():
        raise FileNotFoundError(f"{flag} videoalign needs {Path(context.model_root) / 'VideoReward'} "
                                "(bash download_weights.sh)")
    return {}


def _clip_folder(context: RewardContext, flag: str) -> dict:
    return {"clip_model": resolve_model_folder(context.clip_model, context.model_root, "--clip_model")}


def _pickscore_folders(context: RewardContext, flag: str) -> dict:
    return {"pickscore_model": (resolve_model_folder(context.pickscore_model, context.model_root, "--pickscore_model"),
                                resolve_model_folder(context.pickscore_processor, context.model_root,
                                                     "--pickscore_processor"))}


@dataclass(frozen=True)
class HeldOutScorer:
    """A held-out metric of the table: the reward that scores it, reporting its metrics under their own keys."""

    reward: str  # the reward table's name (:func:`~.registry.make_reward`)
    folders: Optional[Callable[[RewardContext, str], dict]] = None  # its model folders found without loading
    # (or FileNotFoundError naming the flag), as MetricPlan fields
    weighted: bool = False  # it adds the 'Weighted' column: sum_m w_m * metric_m with --reward_weights


HELD_OUT_SCORERS: Dict[str, HeldOutScorer] = {  # any other name: a reward of the registry, under <name>_<metric>
    "videoalign": HeldOutScorer("videoalign_local", _videoalign_folder, weighted=True),
    "videoalign_local": HeldOutScorer("videoalign_local", _videoalign_folder, weighted=True),
    "clipscore": HeldOutScorer("clipscore", _clip_folder),
    "pickscore": HeldOutScorer("pickscore", _pickscore_folders),
}
VIDEOALIGN_NAMES = tuple(name for name, scorer in HELD_OUT_SCORERS.items() if scorer.weighted)


@dataclass(frozen=True)
class MetricPlan:
    names: Tuple[str, ...]  # as requested, in order
    videoalign_weights: Dict[str, float]  # the 'Weighted' column: sum_m w_m * metric_m
    clip_model: Optional[Path] = None
    pickscore_model: Optional[Tuple[Path, Path]] = None  # (model, processor)
    rewards: Tuple[str, ...] = ()  # any other reward name the registry resolves


def _first_names() -> Tuple[str, ...]:
    """The table's names, one per scorer (``videoalign``, not also its alias ``videoalign_local``)."""
    first: Dict[HeldOutScorer, str] = {}
    for name, scorer in HELD_OUT_SCORERS.items():
        first.setdefault(scorer, name)
    return tuple(first.values())


def registry_name(metric: str) -> str:
    """The reward model that scores metric ``metric`` (``videoalign`` is ``videoalign_local``)."""
    return HELD_OUT_SCORERS[metric].reward if metric in HELD_OUT_SCORERS else metric


def metric_names(values: Sequence[str]) -> Tuple[str, ...]:
    """Names given comma- and/or space-separated (``["videoalign,clipscore", "pickscore"]``), in order, once each."""
    return tuple(dict.fromkeys(name.strip() for value in values for name in value.split(",") if name.strip()))


def held_out(values: Sequence[str], trained: Iterable[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(kept, dropped): the metrics named in ``values`` whose reward model is not one of the ``trained`` reward models
    (those score the videos already), and the others."""
    names, trained = metric_names(values), set(trained)
    return (tuple(n for n in names if registry_name(n) not in trained),
            tuple(n for n in names if registry_name(n) in trained))


def plan_metrics(names: Sequence[str], *, model_root: str, clip_model: str, pickscore_model: str,
                 pickscore_processor: str, reward_weights: Optional[Mapping | str] = None,
                 flag: str = "--metrics") -> MetricPlan:
    """Validate metric ``names`` and resolve their model folders; loads no model. Raises ValueError or
    FileNotFoundError naming ``flag`` (and ``--reward_weights``, ``--clip_model``, ...)."""
    names = metric_names(names)
    if not names:
        raise ValueError(f"{flag} is empty: e.g. {flag} videoalign,clipscore,pickscore")
    rewards = []
    for name in (name for name in names if name not in HELD_OUT_SCORERS):
        try:
            resolve_reward(name)
        except (ValueError, ImportError) as err:
            raise ValueError(f"{flag}: unknown metric {name!r}: use {', '.join(_first_names())} or a reward "
                             f"name ({str(err).splitlines()[0]})") from None
        rewards.append(name)
    weights = parse_reward_weights(reward_weights) or dict(DEFAULT_VIDEOALIGN_WEIGHTS)
    unknown = sorted(set(weights) - set(VIDEOALIGN_METRICS))
    if unknown:
        raise ValueError(f"--reward_weights: {unknown} are not VideoAlign metrics; use {list(VIDEOALIGN_METRICS)}")
    context = RewardContext(model_root=model_root, clip_model=clip_model, pickscore_model=pickscore_model,
                            pickscore_processor=pickscore_processor)
    folders = {}
    for scorer in dict.fromkeys(HELD_OUT_SCORERS[name] for name in names if name in HELD_OUT_SCORERS):
        folders.update(scorer.folders(context, flag) if scorer.folders is not None else {})
    return MetricPlan(names, weights, rewards=tuple(rewards), **folders)


class Scorers:
    """``scorers(video (3, F, H, W), prompt) -> {key: float}`` over every metric of the plan (module docstring)."""

    def __init__(self, metrics: MetricPlan, model_root: str, device: torch.device, videoalign_dtype: torch.dtype):
        self.metrics = metrics
        self.parts: List[Tuple[str, Callable]] = []  # (reward name for output keys, "" for fixed keys; callable)
        folders = {"clip_model": str(metrics.clip_model)} if metrics.clip_model else {}
        if metrics.pickscore_model:
            folders.update(pickscore_model=str(metrics.pickscore_model[0]),
                           pickscore_processor=str(metrics.pickscore_model[1]))
        context = RewardContext(model_root=model_root, device=device, dtype=videoalign_dtype, **folders)
        for name in metrics.names:
            fixed_keys = name in HELD_OUT_SCORERS
            self.parts.append(("" if fixed_keys else name, make_reward(registry_name(name), context)))

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
        if "VQ" in scores:  # VideoAlign's metrics: the 'Weighted' column
            scores[WEIGHTED] = sum(w * scores[m] for m, w in self.metrics.videoalign_weights.items())
        return scores


def held_out_key_test(plan: Optional[MetricPlan]) -> Callable[[str], bool]:
    """Whether a validation key (``Validation/`` removed) is one the :class:`Scorers` of ``plan`` produce, known
    before any model loads: a built-in's metric names, and for a plug-in its name and ``<name>_...``. Every such key is
    higher-is-better except the toy world's manifold error, which is left out (it is also the ground truth a real run
    lacks). ``plan`` None (no ``--validation_metrics``): no key is."""
    keys, prefixes = set(), []
    for name in plan.names if plan is not None else ():
        scorer = HELD_OUT_SCORERS.get(name)
        spec = BUILTIN_REWARDS.get(registry_name(name))
        if spec is None:
            prefixes.append(name)
        else:
            keys.update(metric if scorer else output_key(name, metric) for metric in spec.metric_names)
        if scorer is not None and scorer.weighted:
            keys.add(WEIGHTED)

    def test(key: str) -> bool:
        return not key.endswith("manifold_error") and (
            key in keys or any(key == p or key.startswith(p + "_") for p in prefixes))

    return test

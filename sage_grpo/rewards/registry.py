"""Reward models by name, plug-ins by dotted path, and the weighted composite the trainer calls.

``build_reward_fn`` turns the reference's ``--reward_model`` / ``--reward_weights`` (plus optional further
models) into one callable. Its configuration is the reference's standard format (``multi_video_score``)::

    {<model name>: {"weight": w, "sub_reward": {metric: w_m, ...}, "kwargs": {...}}, ...}

and its output follows the reference's keys: ``<model>_<metric in lower case>`` for every metric of every model
(``videoalign_local_vq``, ``..._mq``, ``..._ta``, ``..._overall``; a metric named like its model is reported
under the bare model name, as the reference does for single-score models), plus

    avg = sum_models weight * sum_{m in sub_reward} w_m * score_m      (the mean of all raw metrics of a model
                                                                        that has no sub_reward)

so the default ``videoalign_local`` with ``{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}`` gives
``avg = 0.5 VQ + 0.5 MQ + 1.0 TA`` (normalised heads). Validation follows the reference (a dict per model with a
``weight``; a lone model must have weight 1.0) and additionally rejects what it silently ignored: metric names a
model does not produce, invalid JSON, unknown entry keys.

Names resolve one way (:func:`resolve_reward`): the reward table (:data:`REWARDS`: the built-ins of
``BUILTIN_REWARDS``, then what :func:`register_reward` adds), then the plug-in rule (:mod:`.plugins`: a dotted path
``"package.module:attr"`` / ``"package.module.attr"`` to a function or class marked ``@reward_plugin``; a class is
instantiated with the entry's ``kwargs``, a function is used as it is). ``video_align`` / ``video_score2`` are stubs
returning None in the reference and are rejected. With ``remote`` settings the primary model is a
:class:`.remote.RemoteReward` scoring on a reward server instead. ``avg_term_weights`` gives the weight of every output
key in ``avg`` (what ``--reward_aggregation advantage`` weighs the per-term advantages with). ``kwargs`` /
``--reward_kwargs`` are JSON data (strings, numbers, booleans, null, lists, objects) passed to that one reward's
constructor (or bound to that function) only.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping

import torch

from sage_grpo.config.reward_weights import json_dict, number_dict, parse_reward_weights
from sage_grpo.config.schema import shorten

from .base import RewardFn, metric_names_of, score_with_fallback
from .builtins import BUILTIN_REWARDS, DEFAULT_VIDEOALIGN_WEIGHTS, RewardContext, RewardSpec
from .plugins import import_object, is_dotted_path
from .remote import RemoteReward, RemoteSettings

REMOTE_STUBS = ("video_align", "video_score2")
ENTRY_KEYS = ("weight", "sub_reward", "kwargs")
# The reward table: name -> a built-in's RewardSpec, or a plug-in (a callable, a class, or a dotted path loaded under
# the plug-in rule when the name is first resolved). A reward of the package's own is one file (a @reward_plugin class
# or function) and one line here, "name": "sage_grpo.rewards.module:Name"; register_reward adds lines at run time.
REWARDS: dict[str, RewardSpec | str | Callable] = {
    **BUILTIN_REWARDS,
}


def register_reward(name: str, target: str | Callable) -> None:
    """Add the line ``name -> target`` to the reward table: ``target`` is a reward callable, a class, or a dotted
    path; ``name`` is then a ``reward_model`` like the built-ins."""
    if not name or is_dotted_path(name):
        raise ValueError(f"reward name {name!r} must be non-empty and contain no '.' or ':' (those mark paths)")
    if name in BUILTIN_REWARDS or name in REMOTE_STUBS:
        raise ValueError(f"{name!r} is a built-in reward name; register the plug-in under another name")
    REWARDS[name] = target


def _check_json_data(value, label: str) -> None:
    """Refuse anything but JSON data (a YAML file could otherwise hand a constructor other Python objects)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_data(item, f"{label}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{label}: keys must be strings, got {key!r}")
            _check_json_data(item, f"{label}[{key!r}]")
        return
    raise ValueError(f"{label} must be JSON data (strings, numbers, booleans, null, lists, objects), got a "
                     f"{type(value).__name__}")


def _instantiate(obj, kwargs: dict, label: str) -> RewardFn:
    if isinstance(obj, type):
        return obj(**kwargs)
    if not callable(obj):
        raise TypeError(f"reward plug-in {label!r} is a {type(obj).__name__}, not a callable or class")
    return functools.partial(obj, **kwargs) if kwargs else obj


def resolve_reward(name: str) -> RewardSpec | Callable:
    """What ``name`` refers to, without building it: its line in the reward table (a built-in's spec, a registered
    plug-in), else a dotted path under the plug-in rule (:func:`~.plugins.import_object`)."""
    if name in REMOTE_STUBS:
        raise ValueError(
            f"reward model {name!r} is a remote service that the reference only stubs (it returns None); it is "
            "not supported. Use 'videoalign_local' (local VideoReward) or register your own reward callable."
        )
    target = REWARDS.get(name, name if is_dotted_path(name) else None)
    if target is None:
        known = sorted(BUILTIN_REWARDS) + sorted(set(REWARDS) - set(BUILTIN_REWARDS))
        raise ValueError(f"unknown reward model {name!r}; known: {known}, or give a dotted path "
                         "'package.module:function' to a function or class marked with @reward_plugin")
    return import_object(target) if isinstance(target, str) else target


def make_reward(name: str, ctx: RewardContext, kwargs: dict | None = None) -> RewardFn:
    """Build the reward callable that ``name`` refers to (built-in, registered, or dotted path)."""
    target = resolve_reward(name)
    kwargs = dict(kwargs or {})
    if isinstance(target, RewardSpec):
        return target.build(ctx, kwargs)
    return _instantiate(target, kwargs, name)


def _validate_entry(name: str, entry) -> dict:
    if not isinstance(entry, Mapping):
        raise ValueError(f"reward model entry {name!r} must be a dict like {{'weight': 1.0}}, got {shorten(entry)}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown or "weight" not in entry:
        raise ValueError(
            f"reward model entry {name!r} needs 'weight' and may have {ENTRY_KEYS[1:]}; got keys {sorted(entry)}"
        )
    weight = number_dict({"weight": entry["weight"]}, name)["weight"]
    sub_reward = entry.get("sub_reward")
    if sub_reward is not None and not isinstance(sub_reward, Mapping):
        raise ValueError(f"'sub_reward' of {name!r} must be a dict metric -> weight, got {shorten(sub_reward)}")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"'kwargs' of {name!r} must be a dict of constructor arguments, got {shorten(kwargs)}")
    _check_json_data(kwargs, f"'kwargs' of {name!r}")
    return {
        "weight": weight,
        "sub_reward": number_dict(sub_reward, f"{name}.sub_reward") if sub_reward is not None else None,
        "kwargs": dict(kwargs),
    }


def output_key(model: str, metric: str) -> str:
    metric = metric.strip().lower()
    return model if metric == model.lower() else f"{model}_{metric}"


def _resolve_metric(model: str, metric: str, available: tuple[str, ...], fix: str = "") -> str:
    """Exact name, else the unique case-insensitive match (the reference tries lower case, then as given)."""
    if metric in available:
        return metric
    matches = [m for m in available if m.lower() == metric.lower()]
    if len(matches) != 1:
        raise ValueError(f"reward model {model!r} has no metric {metric!r} for sub_reward; its metrics: {available}"
                         + (f"; {fix}" if fix else ""))
    return matches[0]


def declared_metrics(target: RewardSpec | Callable) -> tuple[str, ...] | None:
    """The metrics a resolved reward (:func:`resolve_reward`) declares before it is built, or None."""
    return target.metric_names if isinstance(target, RewardSpec) else metric_names_of(target)


def _check_weights(model: str, sub_reward: dict[str, float], target, primary: bool) -> None:
    """The sub-reward weights of ``model`` against the metrics it declares, before anything is built: one line naming
    the mismatch and weights that would work. A plug-in that declares no ``metric_names`` is checked at its first
    call, except against VideoAlign's weights (``--reward_weights``' default), which it cannot be meant to take."""
    declared = declared_metrics(target)
    spec_default = target.default_weights if isinstance(target, RewardSpec) else None
    example = json.dumps(spec_default or {(declared or ("<its metric>",))[0]: 1.0})
    fix = (f"use --reward_weights '{example}' (or '' to weigh its metrics equally)" if primary else
           f"give its entry \"sub_reward\": {example} (or none, to weigh its metrics equally)")
    if declared is None:
        if sub_reward == DEFAULT_VIDEOALIGN_WEIGHTS and model not in BUILTIN_REWARDS:
            raise ValueError(f"the weights {json.dumps(sub_reward)} are VideoAlign's (the default of "
                             f"--reward_weights), and reward model {model!r} declares no metric_names to check them "
                             f"against; {fix}, or declare its metrics (e.g. my_reward.metric_names = (\"score\",))")
        return
    for metric in sub_reward:
        _resolve_metric(model, metric, declared, fix)


class CompositeReward:
    """Several reward models combined into the reference's output dict (see module docstring)."""

    def __init__(self, models: dict[str, dict], fns: dict[str, RewardFn], batch_size: int | None = None):
        self.models = models
        self.fns = fns
        self.batch_size = batch_size
        self._resolved = {}  # model -> {metric actually produced: weight}
        for name, fn in fns.items():
            declared = metric_names_of(fn)
            if declared is not None:
                self._resolve_weights(name, declared)

    def _resolve_weights(self, name: str, available: tuple[str, ...]) -> None:
        sub_reward = self.models[name]["sub_reward"]
        if sub_reward is not None:
            self._resolved[name] = {_resolve_metric(name, m, available): w for m, w in sub_reward.items()}

    @property
    def metric_names(self) -> tuple[str, ...] | None:
        """Output keys (``avg`` last) when every model declares its metrics."""
        keys = []
        for name, fn in self.fns.items():
            declared = metric_names_of(fn)
            if declared is None:
                return None
            keys += [output_key(name, m) for m in declared]
        return tuple(keys) + ("avg",)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        if videos.ndim != 5 or videos.shape[1] != 3:
            raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
        out: dict[str, torch.Tensor] = {}
        avg = torch.zeros(len(prompts), dtype=torch.float32)
        with torch.no_grad():
            for name, fn in self.fns.items():
                raw = score_with_fallback(fn, videos, prompts, name=name, batch_size=self.batch_size,
                                          metric_names=metric_names_of(fn))
                if not raw:  # every sample failed and the model declares no metric names: NaN, counted as failed
                    avg += torch.full_like(avg, math.nan)
                    continue
                for metric, values in raw.items():
                    key = output_key(name, metric)
                    if key in out:
                        raise ValueError(f"reward output key {key!r} is produced twice; rename a model or metric")
                    out[key] = values
                avg += self.models[name]["weight"] * self._model_score(name, raw)
        out["avg"] = avg
        return out

    def _model_score(self, name: str, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.models[name]["sub_reward"] is None:
            return torch.stack(list(raw.values())).mean(dim=0)
        if name not in self._resolved:
            self._resolve_weights(name, tuple(raw))
        return sum(weight * raw[metric] for metric, weight in self._resolved[name].items())


def build_reward_fn(
    reward_model: str = "videoalign_local",
    reward_weights: Mapping | str | None = None,
    *,
    context: RewardContext = RewardContext(),
    reward_kwargs: Mapping | str | None = None,
    extra_models: Mapping[str, Mapping] | str | None = None,
    batch_size: int | None = None,
    remote: RemoteSettings | None = None,
) -> CompositeReward:
    """Build the trainer's reward: ``fn(videos (B,3,F,H,W) in [0,1], prompts) -> {key: (B,)} incl. "avg"``.

    Args:
        reward_model: ``--reward_model``: a name from ``BUILTIN_REWARDS`` (``"auto"`` = ``videoalign_local``),
            a ``register_reward`` name, or a dotted path to a reward callable/class.
        reward_weights: ``--reward_weights``, the primary model's sub_reward (dict or JSON). None: the model's
            default (``{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}`` for videoalign_local, none otherwise); empty:
            the reference fallback ``{"VQ": 1, "MQ": 1, "TA": 1}`` for videoalign_local, none otherwise. A model
            without sub_reward contributes the mean of its raw metrics to ``avg``.
        context: what every model of the composite shares (:class:`RewardContext`): the folder holding
            ``VideoReward/`` (the trainer's ``--pretrained_model_root``), ``--reward_checkpoint_mode``, the device and
            dtype VideoReward runs in, the frame rate of the videos passed in (24 for HunyuanVideo-1.5 rollouts),
            whether VideoAlign scores each video after an mp4 round trip (as the reference does), and VideoAlign's
            frame sampling overrides.
        reward_kwargs: constructor arguments of the primary model, dict or JSON (e.g. ``{"target_rgb": [0, 0, 1]}``
            for ``target_color``, ``{"checkpoint_step": 11352}`` for ``videoalign_local``).
        extra_models: further models ``{name: {"weight": w, "sub_reward": {...}, "kwargs": {...}}}`` (dict or
            JSON; an entry may be the weight alone, ``{name: w}``, or None for 1.0; a built-in without sub_reward
            gets its default weights, e.g. ``{"clipscore": 1.0}``); an entry named like ``reward_model`` updates the
            primary entry (to give it a weight other than 1.0), which keeps its sub_reward and kwargs unless the
            entry gives them.
        batch_size: videos per reward-model call (None: the whole batch; 1: the reference's one at a time).
        remote: score ``reward_model`` on the reward server these settings name (:mod:`.remote`) instead of
            building it here; further models (``extra_models``) stay local.
    """
    models = plan_reward_models(reward_model, reward_weights, reward_kwargs, extra_models, batch_size)
    primary = next(iter(models))
    fns = {model: (RemoteReward(model, remote, video_fps=context.video_fps) if remote is not None and model == primary
                   else make_reward(model, context, cfg["kwargs"])) for model, cfg in models.items()}
    return CompositeReward(models, fns, batch_size)


def plan_reward_models(
    reward_model: str = "videoalign_local",
    reward_weights: Mapping | str | None = None,
    reward_kwargs: Mapping | str | None = None,
    extra_models: Mapping[str, Mapping] | str | None = None,
    batch_size: int | None = None,
) -> dict[str, dict]:
    """Everything :func:`build_reward_fn` checks before building a model: the entries ``{name: {"weight",
    "sub_reward", "kwargs"}}`` after validation, every name resolved (plug-ins imported under the plug-in rule,
    nothing instantiated), metric names of the built-ins checked. Cheap: the trainer calls it before any model
    loads."""
    name = "videoalign_local" if reward_model == "auto" else reward_model
    weights = parse_reward_weights(reward_weights)
    spec = BUILTIN_REWARDS.get(name)
    if weights is None:
        sub_reward = spec.default_weights if spec else None
    elif not weights:
        sub_reward = spec.empty_weights if spec else None
    else:
        sub_reward = weights
    kwargs = json_dict(reward_kwargs or {}, "reward_kwargs", '{"target_rgb": [0.0, 0.0, 1.0]}')
    entries = {name: {"weight": 1.0, "sub_reward": sub_reward, "kwargs": kwargs}}
    extra = json_dict(extra_models or {}, "extra_models", '{"temporal_smoothness": {"weight": 0.5}}')
    for model, entry in extra.items():  # a weight alone (or nothing: 1.0) is an entry too
        entry = {"weight": 1.0 if entry is None else entry} if not isinstance(entry, Mapping) else entry
        entries[model] = {**entries[model], **entry} if model in entries else entry  # the primary keeps the rest
    models = {model: _validate_entry(model, entry) for model, entry in entries.items()}
    for model, cfg in models.items():  # a further built-in without sub_reward: its default weights, as the primary
        default = BUILTIN_REWARDS[model].default_weights if model in BUILTIN_REWARDS else None
        if model != name and cfg["sub_reward"] is None and default is not None:
            cfg["sub_reward"] = dict(default)
    if len(models) == 1 and abs(models[name]["weight"] - 1.0) > 1e-6:
        raise ValueError(
            f"a single reward model must have weight 1.0, got {models[name]['weight']} for {name!r}; "
            "use 1.0 or add another model through extra_models"
        )
    if not any(cfg["weight"] for cfg in models.values()):
        raise ValueError(f"every reward model's weight is 0 ({', '.join(models)}), so the reward is 0 for every video "
                         "and nothing is learnt; give one a weight, e.g. 1.0")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None (whole batch), got {batch_size}")
    for model, cfg in models.items():  # catch metric-name typos and bad plug-ins before loading any model
        target = resolve_reward(model)
        if cfg["sub_reward"] is not None:
            _check_weights(model, cfg["sub_reward"], target, primary=model == name)
    return models


def check_reward_files(models: dict[str, dict], context: RewardContext) -> None:
    """The model folders of the planned ``models`` that say which they load (CLIPScore, PickScore) exist; raises
    FileNotFoundError naming the flag. Loads nothing."""
    for model in models:
        spec = BUILTIN_REWARDS.get(model)
        if spec is not None and spec.files is not None:
            spec.files(context)


def avg_term_weights(models: dict[str, dict]) -> dict[str, float]:
    """The weight of every output key in ``avg`` for the planned ``models`` (:func:`plan_reward_models`), so that
    ``avg = sum_k w_k * out[k]``: ``weight * w_m`` for a metric of ``sub_reward``, ``weight / n`` for each of the n
    metrics of a model without one. Resolves names without building anything; a model with neither ``sub_reward``
    nor declared ``metric_names`` has no known terms and is an error."""
    weights: dict[str, float] = {}
    for name, cfg in models.items():
        if cfg["sub_reward"] is not None:
            weights.update({output_key(name, m): cfg["weight"] * w for m, w in cfg["sub_reward"].items()})
            continue
        metrics = declared_metrics(resolve_reward(name))
        if not metrics:
            raise ValueError(f"reward model {name!r} declares no metric_names and has no sub_reward weights, so its "
                             "terms are unknown before it runs; give it weights (--reward_weights '{\"score\": 1.0}') "
                             "or declare metric_names on the callable")
        weights.update({output_key(name, m): cfg["weight"] / len(metrics) for m in metrics})
    return weights

"""Rewards: the VideoAlign (VideoReward) model, toy rewards, plug-ins, and the weighted composite.

Contract: a reward callable maps ``videos (B, 3, F, H, W)`` in [0, 1] and B prompts to ``{metric: tensor (B,)}``.
``build_reward_fn`` combines reward models into the reference's output keys (``videoalign_local_vq`` ...,
``avg``) with its failure policy (failed samples score NaN with a warning).

Modules: ``base`` (contract, failure policy), ``builtins`` (the table of built-in rewards), ``registry`` (the reward
table, the one resolver of names, the composite), ``plugins`` (the plug-in rule of dotted paths), ``scorers`` (the
table of held-out metrics: the evaluation's and the scored validation's), ``toys``, ``videoalign`` (the reward
callable) with ``videoalign_checkpoint`` (files, key remapping, loading), ``videoalign_model`` (network, pooling),
``videoalign_inputs`` (batch assembly), ``video_preprocess`` (torch-only frame sampling/resize/patchify, mp4 IO),
``prompt_templates``, ``tiny`` (tiny checkpoints), ``clip_score`` / ``pick_score`` (the evaluation's CLIPScore and
PickScore), and ``remote`` / ``serving`` (the ``--remote_reward_url`` client and the reward server behind it).
``videoalign``, ``clip_score``, ``pick_score`` and ``tiny`` import transformers/peft and are not imported here.
"""

from .base import RewardFn, score_with_fallback
from .plugins import import_object, reward_plugin
from .registry import (
    BUILTIN_REWARDS,
    REWARDS,
    CompositeReward,
    avg_term_weights,
    build_reward_fn,
    make_reward,
    plan_reward_models,
    register_reward,
)
from .toys import BrightnessReward, TargetColorReward, TemporalSmoothnessReward, ToySuiteReward

__all__ = [
    "BUILTIN_REWARDS",
    "REWARDS",
    "BrightnessReward",
    "CompositeReward",
    "RewardFn",
    "TargetColorReward",
    "TemporalSmoothnessReward",
    "ToySuiteReward",
    "avg_term_weights",
    "build_reward_fn",
    "import_object",
    "make_reward",
    "plan_reward_models",
    "register_reward",
    "reward_plugin",
    "score_with_fallback",
]

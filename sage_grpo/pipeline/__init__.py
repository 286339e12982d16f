"""Rollout and replay: sampling videos with per-step log-probs, and re-scoring stored transitions with gradients.

``rollout`` and ``replay_step`` share one CFG velocity function (``velocity.cfg_velocity``) and one SDE kernel
(``sage_grpo.sde.step``), which is what makes a replayed log-prob equal the rollout's bit for bit.
"""

from sage_grpo.pipeline.replay import replay_step
from sage_grpo.pipeline.rollout import RolloutOutput, VideoSize, latent_shape, rollout
from sage_grpo.pipeline.velocity import T2V_IMAGE_TOKENS, cfg_velocity, step_timesteps

__all__ = [
    "T2V_IMAGE_TOKENS",
    "RolloutOutput",
    "VideoSize",
    "cfg_velocity",
    "latent_shape",
    "replay_step",
    "rollout",
    "step_timesteps",
]

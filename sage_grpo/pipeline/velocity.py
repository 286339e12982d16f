"""The model timesteps of a schedule's steps that the guided velocity (:mod:`sage_grpo.models.velocity`, the one
transformer call shared by rollout and replay) is called at: 1000·σ_k, and a mean-flow transformer's second timestep
1000·σ_{k+1}. The velocity's names the pipeline's modules import are importable from here too.
"""

from typing import Union

import torch
from torch import Tensor

from sage_grpo.models.velocity import T2V_IMAGE_TOKENS, cfg_velocity, t2v_model_input, text_layout  # noqa: F401
from sage_grpo.sde import timesteps_from_sigmas
from sage_grpo.sde.schedule import NUM_TRAIN_TIMESTEPS


def step_timesteps(sigmas: Tensor, index: Union[int, Tensor], batch_size: int) -> Tensor:
    """(B,) fp32 model timesteps 1000·σ_k for a shared int index or a per-sample (B,) index."""
    timesteps = timesteps_from_sigmas(sigmas)
    if isinstance(index, Tensor):
        return timesteps.to(index.device)[index]
    return timesteps[index].expand(batch_size)


def next_step_timesteps(sigmas: Tensor, index: Union[int, Tensor], batch_size: int) -> Tensor:
    """(B,) fp32 second timesteps 1000·σ_{k+1} of a mean-flow transformer at step k (shared int or per-sample (B,)
    index): the next point of the schedule, 0 at the last step (σ_N = 0), as diffusers' image-to-video pipeline."""
    timesteps = (sigmas[1:] * NUM_TRAIN_TIMESTEPS).to(torch.float32)
    if isinstance(index, Tensor):
        return timesteps.to(index.device)[index]
    return timesteps[index].expand(batch_size)

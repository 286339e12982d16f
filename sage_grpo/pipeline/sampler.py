"""``Sampler``: every setting of the SDE sampler decided once, then used by rollout, replay, the reference means and
validation alike (so that, e.g., replay can never use another η or guidance scale than the rollout it replays).

It holds the SDE kernel (resolved once from its name), η, the σ schedule, the guidance scale, the autocast dtype,
the number of (zero) image tokens, the micro-batch size and the solver flag, and forwards to
:func:`~sage_grpo.pipeline.rollout.rollout` and :func:`~sage_grpo.pipeline.replay.replay_step`. :meth:`Sampler.with_schedule` gives the validation sampler (another
schedule, the same model settings).
"""

from dataclasses import dataclass, replace
from typing import Optional, Protocol, Sequence, Union

import torch
from torch import Tensor

from sage_grpo import sde
from sage_grpo.config.train.model import ModelConfig, ParallelConfig
from sage_grpo.config.train.rollout import RolloutConfig
from sage_grpo.dtypes import autocast_dtype_of
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.replay import replay_step
from sage_grpo.pipeline.rollout import RolloutOutput, VideoSize, rollout
from sage_grpo.pipeline.velocity import T2V_IMAGE_TOKENS
from sage_grpo.rl.grad_balance import grad_balance_scales


@dataclass(frozen=True)
class Sampler:
    kernel: sde.SDEKernel  # resolved once from the SDE name (``build``); no step looks it up again
    eta: float
    sigmas: Tensor  # (N+1,) fp32, from 1 down to 0
    guidance_scale: float
    autocast_dtype: Optional[torch.dtype] = None
    num_image_tokens: int = T2V_IMAGE_TOKENS
    micro_batch_size: int = 1
    sde_solver: bool = True  # include the score (Itô) correction in the SDE mean (sage_grpo, dance_grpo)

    @classmethod
    def build(cls, sde_type: str, eta: float, num_steps: int, shift: float, guidance_scale: float,
              **settings) -> "Sampler":
        """The sampler of ``num_steps`` steps on the ``shift``-ed schedule; an unknown ``sde_type`` fails here, and
        the schedule is checked for this SDE."""
        kernel = sde.get_kernel(sde_type)
        sigmas = sde.shifted_sigmas(num_steps, shift)
        sde.check_schedule(kernel, sigmas, eta)
        return cls(kernel, eta, sigmas, guidance_scale, **settings)

    @classmethod
    def euler(cls, num_steps: int, shift: float, guidance_scale: float, **settings) -> "Sampler":
        """A sampler for deterministic (Euler ODE) rollouts, e.g. generation: no SDE step is drawn, so the schedule
        is not checked for one (any step count); the kernel and η (sage_grpo, 0.5) only enter the recorded
        log-probs."""
        return cls(sde.get_kernel("sage_grpo"), 0.5, sde.shifted_sigmas(num_steps, shift), guidance_scale, **settings)

    @property
    def sde_type(self) -> str:
        return self.kernel.name

    @property
    def num_steps(self) -> int:
        return self.sigmas.numel() - 1

    def with_schedule(self, num_steps: int, shift: float) -> "Sampler":
        """The same sampler on another schedule (validation: its own steps and shift, run deterministically)."""
        return replace(self, sigmas=sde.shifted_sigmas(num_steps, shift))

    def with_micro_batch(self, micro_batch_size: int) -> "Sampler":
        """The same sampler, ``micro_batch_size`` samples (or transitions) per transformer call (the reference
        means' own batch, ``--reference_batch_size``)."""
        return replace(self, micro_batch_size=micro_batch_size)

    def grad_balance_scales(self) -> Tensor:
        """The gradient-norm equalizer's (N,) per-step scales for this SDE, η and schedule."""
        return grad_balance_scales(self.kernel.name, self.sigmas, self.eta)

    def rollout(self, transformer, vae, embeds: PromptEmbeds, seeds: Sequence[int], *, num_frames: int, height: int,
                width: int, deterministic: Union[bool, Sequence[bool]] = False,
                sde_generators: Optional[Sequence[torch.Generator]] = None, decode: bool = True,
                progress: bool = False) -> RolloutOutput:
        return rollout(self, transformer, vae, embeds, seeds, VideoSize(num_frames, height, width),
                       deterministic=deterministic, sde_generators=sde_generators, decode=decode, progress=progress)

    def replay(self, transformer, latents: Tensor, next_latents: Tensor, index: Union[int, Tensor],
               embeds: PromptEmbeds) -> sde.SDEStepOutput:
        return replay_step(self, transformer, latents, next_latents, index, embeds)

    @torch.no_grad()
    def transition_means(self, transformer, latents: Tensor, embeds: PromptEmbeds, device: torch.device,
                         progress: bool = False, steps: Optional[Tensor] = None) -> Tensor:
        """SDE means of the stored transitions of a rollout: ``latents`` (B, N+1, C, T, h, w) -> (B, N, C, T, h, w)
        fp32 on ``device`` (the KL reference's means; they stay there for the update's KL terms, the size of the
        rollout's own trajectory, with no copy to the host and back: a ``.cpu()`` per forward was a host sync).

        ``steps``: only those steps' transitions (the SDE window, ``rl.sde_window``); the others are never trained
        and are NaN, so that any accidental use is loud. The transitions are replayed ``micro_batch_size`` per
        forward in sample-major order, a forward mixing samples and steps (one step index per row); its inputs go to
        ``device``. ``progress``: a tqdm bar.
        """
        from tqdm.auto import tqdm

        batch, num_steps = latents.shape[0], latents.shape[1] - 1
        chosen = torch.arange(num_steps) if steps is None else steps.reshape(-1).cpu()
        pairs = torch.cartesian_prod(torch.arange(batch), chosen)  # (B*n, 2): (sample, step)
        means = torch.full((batch, num_steps, *latents.shape[2:]), float("nan"), dtype=torch.float32, device=device)
        for chunk in tqdm(pairs.split(self.micro_batch_size), desc="reference means", leave=False,
                          disable=not progress):
            rows, index = chunk[:, 0], chunk[:, 1]
            rows_on, index_on = rows.to(device), index.to(device)
            out = self.replay(transformer, latents[rows_on, index_on], latents[rows_on, index_on + 1], index_on,
                              embeds.select(rows.tolist()).to(device))
            means[rows_on, index_on] = out.mean.float()
        return means


class SamplerOptions(Protocol):
    """The sections of the training configuration the rollout sampler is built from (declared by shape): the SDE
    and its schedule (``rollout``), the compute dtype and image tokens (``model``), the micro-batch (``parallel``)."""

    model: ModelConfig
    rollout: RolloutConfig
    parallel: ParallelConfig


def sampler_of(cfg: SamplerOptions) -> Sampler:
    """The rollout sampler of the run: ``--sde_type``, ``--eta``, ``--grpo_sampling_steps`` on the
    ``--infer_flow_shift_video`` schedule, ``--cfg_scale``; built once, before any model loads (a schedule the SDE
    cannot use is refused here)."""
    return Sampler.build(cfg.rollout.sde_type, cfg.rollout.eta, cfg.rollout.grpo_sampling_steps, cfg.rollout.infer_flow_shift_video, cfg.rollout.cfg_scale,
                         autocast_dtype=autocast_dtype_of(cfg), num_image_tokens=cfg.model.vision_num_semantic_tokens,
                         micro_batch_size=cfg.parallel.mini_batch_size_per_update)

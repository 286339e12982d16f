"""``Sampler``: every setting of the SDE sampler decided once, then used by rollout, replay, the reference means and
validation alike (so that, e.g., replay can never use another η or guidance scale than the rollout it replays).

It holds the SDE kernel (``sde_type``), η, the σ schedule, the guidance scale, the autocast dtype, the number of
(zero) image tokens and the micro-batch size, and forwards to :func:`~sage_grpo.pipeline.rollout.rollout` and
:func:`~sage_grpo.pipeline.replay.replay_step`. :meth:`Sampler.with_schedule` gives the validation sampler (another
schedule, the same model settings).
"""

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from sage_grpo import sde
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.replay import replay_step
from sage_grpo.pipeline.rollout import RolloutOutput, rollout
from sage_grpo.pipeline.velocity import T2V_IMAGE_TOKENS


@dataclass(frozen=True)
class Sampler:
    sde_type: str
    eta: float
    sigmas: Tensor  # (N+1,) fp32, from 1 down to 0
    guidance_scale: float
    autocast_dtype: Optional[torch.dtype] = None
    num_image_tokens: int = T2V_IMAGE_TOKENS
    micro_batch_size: int = 1

    @classmethod
    def build(cls, sde_type: str, eta: float, num_steps: int, shift: float, guidance_scale: float,
              **settings) -> "Sampler":
        """The sampler of ``num_steps`` steps on the ``shift``-ed schedule; the schedule is checked for this SDE."""
        sigmas = sde.shifted_sigmas(num_steps, shift)
        sde.check_schedule(sde_type, sigmas, eta)
        return cls(sde_type, eta, sigmas, guidance_scale, **settings)

    @property
    def num_steps(self) -> int:
        return self.sigmas.numel() - 1

    def with_schedule(self, num_steps: int, shift: float) -> "Sampler":
        """The same sampler on another schedule (validation: its own steps and shift, run deterministically)."""
        return replace(self, sigmas=sde.shifted_sigmas(num_steps, shift))

    def grad_balance_scales(self) -> Tensor:
        """The gradient-norm equalizer's (N,) per-step scales for this SDE, η and schedule."""
        return sde.grad_balance_scales(self.sde_type, self.sigmas, self.eta)

    def rollout(self, transformer, vae, embeds: PromptEmbeds, seeds: Sequence[int], *, num_frames: int, height: int,
                width: int, deterministic: Union[bool, Sequence[bool]] = False,
                sde_generators: Optional[Sequence[torch.Generator]] = None, decode: bool = True,
                progress: bool = False) -> RolloutOutput:
        return rollout(transformer, vae, embeds, seeds, sde_type=self.sde_type, eta=self.eta,
                       guidance_scale=self.guidance_scale, num_frames=num_frames, height=height, width=width,
                       deterministic=deterministic, sigmas=self.sigmas, sde_generators=sde_generators,
                       micro_batch_size=self.micro_batch_size, autocast_dtype=self.autocast_dtype,
                       num_image_tokens=self.num_image_tokens, decode=decode, progress=progress)

    def replay(self, transformer, latents: Tensor, next_latents: Tensor, index: Union[int, Tensor],
               embeds: PromptEmbeds) -> sde.SDEStepOutput:
        return replay_step(transformer, latents, next_latents, self.sigmas, index, embeds, sde_type=self.sde_type,
                           eta=self.eta, guidance_scale=self.guidance_scale, autocast_dtype=self.autocast_dtype,
                           num_image_tokens=self.num_image_tokens)

    @torch.no_grad()
    def transition_means(self, transformer, latents: Tensor, embeds: PromptEmbeds, device: torch.device,
                         progress: bool = False) -> Tensor:
        """SDE means of every stored transition of a rollout: ``latents`` (B, N+1, C, T, h, w) -> (B, N, C, T, h, w)
        fp32 on the CPU (the KL reference's means).

        The B x N transitions are replayed ``micro_batch_size`` per forward in sample-major order, a forward mixing
        samples and steps (one step index per row); its inputs go to ``device``. ``progress``: a tqdm bar.
        """
        from tqdm.auto import tqdm

        batch, num_steps = latents.shape[0], latents.shape[1] - 1
        pairs = torch.cartesian_prod(torch.arange(batch), torch.arange(num_steps))  # (B*N, 2): (sample, step)
        means = torch.empty((batch, num_steps, *latents.shape[2:]), dtype=torch.float32)
        for chunk in tqdm(pairs.split(self.micro_batch_size), desc="reference means", leave=False,
                          disable=not progress):
            rows, steps = chunk[:, 0], chunk[:, 1]
            out = self.replay(transformer, latents[rows, steps].to(device), latents[rows, steps + 1].to(device),
                              steps.to(device), embeds.select(rows.tolist()).to(device))
            means[rows, steps] = out.mean.float().cpu()
        return means

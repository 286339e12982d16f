"""GRPO rollout: sample B videos with an SDE sampler and record every latent and per-step log-probability.

For each sample i (seed s_i) and step k = 0..N-1 on the shifted schedule σ
(docs/reference.md#the-schedule-and-the-sde-steps):

    v_k     = v_u + g·(v_c − v_u)                       (CFG velocity, ``velocity.cfg_velocity``; a mean-flow
                                                         transformer also gets r = 1000·σ_{k+1})
    x_{k+1} = μ_k + noise_std_k·ε_k                     (or x_k + dt·v_k on a deterministic step)
    log p_k = mean over elements of log N(x_{k+1}; μ_k, noise_std_k²)

using :func:`sage_grpo.sde.step`, the same kernel :func:`~sage_grpo.pipeline.replay.replay_step` re-scores with. With
every step deterministic this is the plain Euler flow-matching ODE sampler that ``generate.py`` uses; it matches
diffusers' ``HunyuanVideo15Pipeline`` (tested to 1e-5 in fp32).

Randomness: each sample owns a CPU ``torch.Generator`` seeded with its seed. It first draws the initial noise x_0
(fp32, (C, T, h, w)) and then every SDE noise ε_k of that sample, so a sample's trajectory does not depend on the
batch or micro-batch it runs in, nor on the device. ``initial_latents`` replaces the drawn x_0 (the draw still
happens, so the SDE noise is the same as without it). ``sde_generators`` (one per sample) take over the SDE noise,
e.g. so that a prompt re-drawn in a later epoch keeps its seeded x_0 but gets fresh SDE noise. The SDE noise of the
whole rollout (B x stochastic steps latents, fp32) is drawn on the CPU before the first step, in the order the steps
consume it, and moved to the device in one copy (:func:`draw_sde_noise`).

Micro-batching: ``micro_batch_size`` samples go through the transformer together (the reference uses 1). Replaying a
stored transition with the same micro-batch composition reproduces the log-probs bit-exactly.

Departures from the reference:
- SDE noise comes from the per-sample generators, not the global CUDA RNG (docs/reference.md#d10).
- The initial latent stays fp32 (the reference draws it in bf16).
- The final latent is divided by the VAE scaling factor ONCE before decoding, as diffusers and the reference's
  ``generate.py`` do; the reference's GRPO pipeline divides twice, so its rollout videos (and rewards) come from
  latents ≈7% too small (docs/reference.md#d7).
- The VAE decodes in its own dtype (the reference uses fp16 autocast with tiling); enable tiling on the VAE for
  large videos (``vae.enable_tiling()``).
"""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sage_grpo import sde
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.models.vae import decode_latents, latent_shape
from sage_grpo.models.resolution import bucket_hw
from sage_grpo.pipeline.velocity import cfg_velocity, next_step_timesteps, step_timesteps

DEFAULT_HEIGHT, DEFAULT_WIDTH = bucket_hw(480)  # 352 x 624
DEFAULT_NUM_FRAMES = 81


@dataclass
class RolloutOutput:
    """What a rollout returns; latents and log-probs stay on the compute device."""

    videos: Optional[Tensor]  # (B, 3, F, H, W) float in [0, 1] on the CPU; None when decode=False
    latents: Tensor  # (B, N+1, C, T, h, w) fp32: x_0 (initial noise), then the latent after each step
    log_probs: Tensor  # (B, N) fp32 log p(x_{k+1} | x_k)
    sigmas: Tensor  # (N+1,) fp32 schedule
    timesteps: Tensor  # (N,) fp32 model timesteps 1000·σ_k
    seeds: List[int]
    deterministic: List[bool]  # per step: True = Euler ODE step
    micro_batch_size: int  # samples per transformer call; replay with the same grouping to reproduce log_probs

    @property
    def final_latents(self) -> Tensor:
        return self.latents[:, -1]


def sample_generators(seeds: Sequence[int]) -> List[torch.Generator]:
    """One CPU generator per sample, seeded with its seed."""
    return [torch.Generator("cpu").manual_seed(int(seed)) for seed in seeds]


def draw_initial_noise(generators: Sequence[torch.Generator], shape: Sequence[int]) -> Tensor:
    """(B, *shape) fp32 standard normal noise on the CPU, one row per generator."""
    return torch.stack([torch.randn(tuple(shape), generator=g, dtype=torch.float32) for g in generators])


def draw_sde_noise(generators: Sequence[torch.Generator], flags: Sequence[bool], shape: Sequence[int],
                   micro_batch_size: int) -> Tensor:
    """(B, S, *shape) fp32 SDE noise ε of the S stochastic steps (``flags[k]`` False), row i from ``generators[i]``,
    on the generators' device (the CPU). Drawn in the order the steps used to draw them one by one (micro-batch by
    micro-batch, step by step, sample by sample), so every generator gives the same numbers and ends in the same
    state; the rollout then moves them to the compute device in one copy instead of one per sample and step."""
    num_samples, sde_steps = len(generators), sum(not flag for flag in flags)
    noise = torch.empty(num_samples, sde_steps, *shape, dtype=torch.float32)
    for start in range(0, num_samples, micro_batch_size):
        for slot in range(sde_steps):
            for row in range(start, min(start + micro_batch_size, num_samples)):
                generator = generators[row]
                noise[row, slot] = torch.randn(tuple(shape), generator=generator, device=generator.device,
                                               dtype=torch.float32)
    return noise


def _per_step_flags(deterministic: Union[bool, Sequence[bool]], num_steps: int) -> List[bool]:
    if isinstance(deterministic, bool):
        return [deterministic] * num_steps
    flags = [bool(d) for d in deterministic]
    if len(flags) != num_steps:
        raise ValueError(f"deterministic has {len(flags)} entries for {num_steps} steps")
    return flags


class VideoSize(NamedTuple):
    """The size of the videos a rollout makes, in frames and pixels."""

    num_frames: int = DEFAULT_NUM_FRAMES
    height: int = DEFAULT_HEIGHT
    width: int = DEFAULT_WIDTH


@torch.no_grad()
def rollout(
    sampler,  # a pipeline.sampler.Sampler (it forwards here, so this module does not import it)
    transformer,
    vae,
    embeds: PromptEmbeds,
    seeds: Sequence[int],
    size: VideoSize = VideoSize(),
    *,
    deterministic: Union[bool, Sequence[bool]] = False,
    initial_latents: Optional[Tensor] = None,
    sde_generators: Optional[Sequence[torch.Generator]] = None,
    decode: bool = True,
    progress: bool = False,
) -> RolloutOutput:
    """Roll out ``len(seeds)`` videos of ``size`` for the prompts in ``embeds`` (one row per sample) on the
    transformer's device, with ``sampler``'s kernel, η, schedule, guidance scale, autocast dtype, image tokens and
    micro-batch size.

    ``vae`` gives the latent geometry (its ``config``) and decodes; ``deterministic`` is one bool or one per step;
    ``initial_latents`` (B, C, T, h, w) replaces the seeded initial noise; ``sde_generators`` (one per sample) replace
    the seed generators as the source of the SDE noise (the initial noise still comes from the seeds).
    """
    num_samples = len(seeds)
    if len(embeds) != num_samples:
        raise ValueError(f"got {len(embeds)} prompt embeddings for {num_samples} seeds")
    micro_batch_size, kernel, eta = sampler.micro_batch_size, sampler.kernel, sampler.eta
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    shape = latent_shape(vae.config, *size)
    sigmas = sampler.sigmas.detach().float().cpu()
    num_steps = sigmas.numel() - 1
    flags = _per_step_flags(deterministic, num_steps)
    if not all(flags):  # an Euler-only sampler (``Sampler.euler``) was not checked for SDE steps
        sde.check_schedule(kernel, sigmas, eta)
    device = next(transformer.parameters()).device

    noise, generators = _starting_noise(seeds, shape, initial_latents, sde_generators)
    all_latents = torch.empty(num_samples, num_steps + 1, *shape, dtype=torch.float32, device=device)
    all_log_probs = torch.empty(num_samples, num_steps, dtype=torch.float32, device=device)
    all_latents[:, 0] = noise.to(device)
    sde_noise = draw_sde_noise(generators, flags, shape, micro_batch_size).to(device)  # (B, S, *shape)
    _denoise(sampler, transformer, embeds, sigmas, flags, sde_noise, all_latents, all_log_probs, progress)

    videos = decode_latents(vae, all_latents[:, -1]) if decode else None
    return RolloutOutput(videos=videos, latents=all_latents, log_probs=all_log_probs, sigmas=sigmas,
                         timesteps=sde.timesteps_from_sigmas(sigmas), seeds=[int(s) for s in seeds],
                         deterministic=flags, micro_batch_size=micro_batch_size)


def _starting_noise(seeds: Sequence[int], shape: Sequence[int], initial_latents: Optional[Tensor],
                    sde_generators: Optional[Sequence[torch.Generator]]) -> Tuple[Tensor, List[torch.Generator]]:
    """(x_0 (B, *shape) fp32 on the CPU, the generators of the SDE noise): the seeded initial noise is always drawn
    (so the SDE noise of a seed is the same whether ``initial_latents`` replaces x_0 or not), then ``sde_generators``
    take over the SDE noise where given."""
    num_samples = len(seeds)
    generators = sample_generators(seeds)
    noise = draw_initial_noise(generators, shape)
    if sde_generators is not None:
        if len(sde_generators) != num_samples:
            raise ValueError(f"got {len(sde_generators)} sde_generators for {num_samples} samples")
        generators = list(sde_generators)
    if initial_latents is not None:
        if tuple(initial_latents.shape) != (num_samples, *shape):
            raise ValueError(f"initial_latents must have shape {(num_samples, *shape)}, "
                             f"got {tuple(initial_latents.shape)}")
        noise = initial_latents.detach().float().cpu()
    return noise, generators


def _denoise(sampler, transformer, embeds: PromptEmbeds, sigmas: Tensor, flags: List[bool], sde_noise: Tensor,
             all_latents: Tensor, all_log_probs: Tensor, progress: bool) -> None:
    """Every step of every micro-batch: CFG velocity, then the SDE (or Euler) step with its column of ``sde_noise``;
    each latent and log-prob is written into ``all_latents[:, k + 1]`` and ``all_log_probs[:, k]`` (x_0 is in
    ``all_latents[:, 0]``)."""
    num_samples, num_steps, device = all_latents.shape[0], len(flags), all_latents.device
    micro_batch_size, kernel, eta = sampler.micro_batch_size, sampler.kernel, sampler.eta
    slots = {k: slot for slot, k in enumerate(k for k, flag in enumerate(flags) if not flag)}  # k -> sde_noise column
    bar = tqdm(total=num_steps * -(-num_samples // micro_batch_size), desc="denoising", unit="step", leave=False,
               disable=not progress)
    for start in range(0, num_samples, micro_batch_size):
        rows = slice(start, min(start + micro_batch_size, num_samples))
        batch_embeds = embeds.select(rows).to(device)
        latents = all_latents[rows, 0]
        for k in range(num_steps):
            timesteps = step_timesteps(sigmas, k, latents.shape[0])
            velocity = cfg_velocity(transformer, latents, timesteps, batch_embeds, sampler.guidance_scale,
                                    autocast_dtype=sampler.autocast_dtype, num_image_tokens=sampler.num_image_tokens,
                                    timesteps_r=next_step_timesteps(sigmas, k, latents.shape[0]))
            eps = None if flags[k] else sde_noise[rows, slots[k]]
            out = sde.step(kernel, velocity, latents, sigmas, k, eta, noise=eps, deterministic=flags[k],
                           sde_solver=sampler.sde_solver)
            latents = out.prev_sample
            all_latents[rows, k + 1] = latents
            all_log_probs[rows, k] = out.log_prob
            bar.update()
    bar.close()

"""Decoding final latents into videos with the VAE, shared by the rollout, validation, generation and the model
bundle (so the scaling factor is divided out in one place), and the one rule of the video sizes and frame counts the
VAE takes (the rollout and the start-time check, sage_grpo/models/geometry.py, both ask it)."""
from typing import Optional, Tuple

import torch
from torch import Tensor


def latent_shape(vae_config, num_frames: int, height: int, width: int) -> Tuple[int, int, int, int]:
    """(C, T, h, w) of a video, checking the sizes against the VAE's compression ratios."""
    temporal, spatial = vae_config.temporal_compression_ratio, vae_config.spatial_compression_ratio
    if num_frames < 1 or (num_frames - 1) % temporal:
        raise ValueError(f"num_frames must be 1 + a multiple of {temporal} (e.g. 81 or 121), got {num_frames}")
    if height % spatial or width % spatial or height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive multiples of {spatial}, got {height}x{width}")
    return vae_config.latent_channels, (num_frames - 1) // temporal + 1, height // spatial, width // spatial


@torch.no_grad()
def decode_latents(vae, latents: Tensor, *, tiling: Optional[bool] = None) -> Tensor:
    """(B, C, T, h, w) latents -> (B, 3, F, H, W) float video in [0, 1] on the CPU, one sample at a time; a pixel the
    VAE decodes to NaN or inf is NaN (the reward counts such a video as failed, generate.py refuses to write it).

    ``tiling``: decode tile by tile (diffusers' overlapping spatial tiles, blended; bounded memory at real sizes) or
    not; None leaves the VAE's own setting. The VAE's setting is restored afterwards.
    """
    saved = getattr(vae, "use_tiling", None)
    if tiling is not None:
        vae.use_tiling = bool(tiling)
    try:
        videos = []
        for latent in latents:
            scaled = latent[None].to(vae.dtype) / vae.config.scaling_factor  # divided ONCE (reference: twice)
            decoded = vae.decode(scaled, return_dict=False)[0]
            pixels = decoded.float() / 2 + 0.5
            # clamping would turn inf into 0 or 1: a non-finite pixel stays NaN, so a broken video is seen as broken
            videos.append(torch.where(torch.isfinite(pixels), pixels.clamp(0, 1), torch.nan).cpu())
    finally:
        if tiling is not None:
            vae.use_tiling = saved
    return torch.cat(videos)

"""Decoding final latents into videos with the VAE, shared by the rollout, validation, generation and the model
bundle (so the scaling factor is divided out in one place)."""
from typing import Optional

import torch
from torch import Tensor


@torch.no_grad()
def decode_latents(vae, latents: Tensor, *, tiling: Optional[bool] = None) -> Tensor:
    """(B, C, T, h, w) latents -> (B, 3, F, H, W) float video in [0, 1] on the CPU, one sample at a time.

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
            videos.append((decoded.float() / 2 + 0.5).clamp(0, 1).cpu())
    finally:
        if tiling is not None:
            vae.use_tiling = saved
    return torch.cat(videos)

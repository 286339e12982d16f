"""Writing and reading mp4 videos (imageio + its bundled ffmpeg), and file-name-safe prompt strings."""

import re
from pathlib import Path
from typing import Union

import numpy as np
import torch


def video_to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) float in [0, 1] -> (F, H, W, 3) uint8 (clamp, scale by 255, truncate, as the reference)."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"expected a video of shape (3, F, H, W), got {tuple(video.shape)}")
    frames = (video.detach().float().clamp(0, 1) * 255).to(torch.uint8)
    return frames.permute(1, 2, 3, 0).cpu().numpy()


def write_video(path: Union[str, Path], video: torch.Tensor, fps: float = 24.0) -> Path:
    """Write a (3, F, H, W) video in [0, 1] as H.264 mp4; sizes are kept exactly (no macro-block resize)."""
    import imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, list(video_to_uint8_frames(video)), fps=fps, codec="libx264", quality=8,
                     macro_block_size=1)
    return path


def read_video(path: Union[str, Path]) -> torch.Tensor:
    """Read an mp4 into (3, F, H, W) float in [0, 1]."""
    import imageio

    frames = np.stack(imageio.mimread(str(path), memtest=False))  # (F, H, W, 3) uint8
    return torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 255.0


def sanitize_name(text: str, max_length: int = 50) -> str:
    """Prompt -> file-name fragment: whitespace collapsed, only [A-Za-z0-9 _.-] kept, at most ``max_length`` chars."""
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"[^A-Za-z0-9 _.\-]", "", text)[:max_length].strip().replace(" ", "_") or "prompt"

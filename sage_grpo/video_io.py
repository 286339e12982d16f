"""Writing and reading mp4 videos (imageio + its bundled ffmpeg), and file-name-safe prompt strings."""

import re
from pathlib import Path
from typing import Tuple, Union

import numpy as np
import torch


def video_to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) float in [0, 1] -> (F, H, W, 3) uint8 (clamp, scale by 255, truncate, as the reference)."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"expected a video of shape (3, F, H, W), got {tuple(video.shape)}")
    frames = (video.detach().float().clamp(0, 1) * 255).to(torch.uint8)
    return frames.permute(1, 2, 3, 0).cpu().numpy()


def write_video(path: Union[str, Path], video: torch.Tensor, fps: float = 24.0) -> Path:
    """Write a (3, F, H, W) video in [0, 1] as mp4 the way the reference saves rollouts (``save_videos_grid``):
    uint8 truncation, then ``imageio.mimsave`` with imageio-ffmpeg's defaults (libx264, yuv420p, quality 5); the
    frame size is kept as it is (imageio would otherwise resize sides that are not multiples of 16)."""
    import imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, list(video_to_uint8_frames(video)), fps=fps, macro_block_size=1)
    return path


def read_video_frames(path: Union[str, Path]) -> Tuple[torch.Tensor, float]:
    """Decode a video file into ``(uint8 frames (F, H, W, 3), fps)`` with imageio-ffmpeg."""
    import imageio

    with imageio.get_reader(str(path), format="FFMPEG") as reader:
        fps = float(reader.get_meta_data()["fps"])
        frames = np.stack([np.asarray(frame) for frame in reader])
    return torch.from_numpy(frames), fps


def read_video(path: Union[str, Path]) -> torch.Tensor:
    """Read an mp4 into (3, F, H, W) float in [0, 1]."""
    frames, _ = read_video_frames(path)
    return frames.permute(3, 0, 1, 2).float() / 255.0


def sanitize_name(text: str, max_length: int = 50) -> str:
    """Prompt -> file-name fragment as the reference: whitespace collapsed, only [A-Za-z0-9 _.-] kept, at most
    ``max_length`` characters."""
    collapsed = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"[^A-Za-z0-9 _.-]", "", collapsed)[:max_length].strip()


def mp4_to_gif(path: Union[str, Path], fps: float) -> bytes:
    """An mp4 as an animated GIF (every frame, looping), for trackers that show only GIFs (SwanLab)."""
    import io

    import imageio

    frames, _ = read_video_frames(path)
    buffer = io.BytesIO()
    imageio.mimsave(buffer, list(frames.numpy()), format="GIF", duration=1000.0 / fps, loop=0)
    return buffer.getvalue()

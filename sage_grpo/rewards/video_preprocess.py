"""Torch-only video preprocessing for VideoReward (Qwen2-VL), plus the mp4 round trip the reference scores.

The reference turns a rollout into model input in two libraries: VideoAlign's copy of qwen-vl-utils
(``fetch_video``: frame sampling and a bicubic resize) and transformers' Qwen2-VL video processor (rescale,
CLIP normalisation, patch flattening). The processor needs torchvision, which is unusable here, so this module
re-implements the same arithmetic with plain torch:

1. ``num_sampled_frames`` / ``sample_frame_indices``: uniform sampling at the checkpoint's fps,
   ``n = round_even(clamp(F / video_fps * fps, ceil_even(4), floor_even(min(768, F))))`` capped at ``F``, and
   indices ``round(linspace(0, F - 1, n))`` (ties to even, as ``torch.round``).
2. ``smart_resize`` / ``resize_frames``: both sides multiples of 28 with the area inside
   ``[min_pixels, max_pixels]``, aspect ratio kept; bicubic with antialias, clamped to [0, 255]. Files are
   decoded to uint8 and torchvision resizes uint8 frames by rounding the float result back to uint8, so the mp4
   path rounds (``quantize=True``); decoded rollout tensors are not quantised.
   Then the processor's own resize (``processor_resize``): the Qwen2-VL video processor applies its own
   ``smart_resize`` (``processor_smart_resize``: each side kept at least 28 when it shrinks) with *its* pixel budget (``min_pixels`` / ``max_pixels`` of the base model's processor config) to the
   float frames qwen-vl-utils handed it; a frame already inside that budget is left as it is (the released
   budget, 448x448 against Qwen2-VL's 56x56 .. 12845056), a smaller one is enlarged (bicubic, antialias, float:
   no clamp, no rounding).
3. ``normalize_frames``: ``(x - 255 * mean) / (255 * std)``, the fused rescale + normalise of the fast processor.
4. ``patchify_video``: pad T to a multiple of ``temporal_patch_size`` by repeating the last frame, then the
   Qwen2-VL flattening ``(T, C, H, W) -> (grid_t * grid_h * grid_w, C * tp * p * p)`` in merge-window order.

Frames travel as float tensors in [0, 255], shape ``(T, 3, H, W)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

FRAME_FACTOR = 2  # qwen-vl-utils keeps an even number of frames (one temporal patch = 2 frames)
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_PIXELS = 128 * 28 * 28  # qwen-vl-utils default; the reference never overrides it
# Qwen2VLVideoProcessor's class defaults (size shortest_edge / longest_edge), for a processor config without a budget
PROCESSOR_MIN_PIXELS = 128 * 28 * 28
PROCESSOR_MAX_PIXELS = 28 * 28 * 768
MAX_ASPECT_RATIO = 200


def _round_by(value: float, factor: int) -> int:
    return round(value / factor) * factor  # Python round: ties to even, as in qwen-vl-utils


def _ceil_by(value: float, factor: int) -> int:
    return math.ceil(value / factor) * factor


def _floor_by(value: float, factor: int) -> int:
    return math.floor(value / factor) * factor


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of a {height}x{width} video exceeds {MAX_ASPECT_RATIO}")
    h_bar = max(factor, _round_by(height, factor))
    w_bar = max(factor, _round_by(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = _floor_by(height / beta, factor)
        w_bar = _floor_by(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by(height * beta, factor)
        w_bar = _ceil_by(width * beta, factor)
    return h_bar, w_bar


def processor_smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The Qwen2-VL video processor's ``smart_resize`` (transformers), applied second: unlike qwen-vl-utils' copy
    above it does not floor the first rounding at ``factor`` but keeps each side at least ``factor`` when it
    shrinks, so an extreme aspect ratio never shrinks a side to zero."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of a {height}x{width} video exceeds {MAX_ASPECT_RATIO}")
    h_bar, w_bar = _round_by(height, factor), _round_by(width, factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        return max(factor, _floor_by(height / beta, factor)), max(factor, _floor_by(width / beta, factor))
    if h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        return _ceil_by(height * beta, factor), _ceil_by(width * beta, factor)
    return h_bar, w_bar


def num_sampled_frames(
    total_frames: int, video_fps: float, *, fps: float | None = None, nframes: int | None = None
) -> int:
    """How many frames the reward model sees (qwen-vl-utils ``smart_nframes``); ``nframes`` overrides ``fps``."""
    if nframes is not None:
        count = _round_by(nframes, FRAME_FACTOR)
    else:
        min_frames = _ceil_by(FPS_MIN_FRAMES, FRAME_FACTOR)
        max_frames = _floor_by(min(FPS_MAX_FRAMES, total_frames), FRAME_FACTOR)
        count = total_frames / video_fps * (2.0 if fps is None else fps)
        count = _round_by(min(max(count, min_frames), max_frames), FRAME_FACTOR)
    count = min(count, total_frames)
    if not FRAME_FACTOR <= count <= total_frames:
        raise ValueError(f"cannot sample {count} frames from a {total_frames}-frame video (need >= {FRAME_FACTOR})")
    return count


def sample_frame_indices(total_frames: int, count: int) -> list[int]:
    """Uniformly spaced frame indices, rounded exactly as the reference (float32 linspace, ties to even)."""
    return torch.linspace(0, total_frames - 1, count).round().long().tolist()


def resize_frames(frames: torch.Tensor, size: tuple[int, int], *, quantize: bool) -> torch.Tensor:
    """Bicubic antialiased resize of ``(T, 3, H, W)`` frames in [0, 255]; ``quantize`` rounds to uint8 levels."""
    out = F.interpolate(frames.float(), size=size, mode="bicubic", align_corners=False, antialias=True)
    out.clamp_(0.0, 255.0)  # in place: the interpolation's output is ours
    return out.round_() if quantize else out


def processor_resize(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The video processor's resize of float ``(T, 3, H, W)`` frames: bicubic with antialias, neither clamped nor
    rounded (torchvision's resize of a float tensor)."""
    return F.interpolate(frames.float(), size=size, mode="bicubic", align_corners=False, antialias=True)


def normalize_frames(
    frames: torch.Tensor, mean: tuple[float, ...] = OPENAI_CLIP_MEAN, std: tuple[float, ...] = OPENAI_CLIP_STD
) -> torch.Tensor:
    """Rescale [0, 255] -> [0, 1] and normalise per channel, fused like the fast Qwen2-VL processor."""
    scale = 1.0 / (1.0 / 255.0)
    mean_t = torch.tensor([m * scale for m in mean], dtype=torch.float32, device=frames.device).view(1, -1, 1, 1)
    std_t = torch.tensor([s * scale for s in std], dtype=torch.float32, device=frames.device).view(1, -1, 1, 1)
    return (frames.float() - mean_t) / std_t


def patchify_video(
    frames: torch.Tensor, *, patch_size: int, temporal_patch_size: int, merge_size: int
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Flatten ``(T, C, H, W)`` into Qwen2-VL patches ``(grid_t * grid_h * grid_w, C * tp * p * p)``.

    The row order groups each ``merge_size x merge_size`` window of patches together, which is what the vision
    tower's patch merger expects (transformers ``Qwen2VLVideoProcessor.patchify``).
    """
    num_frames, channels, height, width = frames.shape
    if pad := -num_frames % temporal_patch_size:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)], dim=0)
        num_frames += pad
    grid_t, grid_h, grid_w = num_frames // temporal_patch_size, height // patch_size, width // patch_size
    patches = frames.reshape(
        grid_t, temporal_patch_size, channels,
        grid_h // merge_size, merge_size, patch_size,
        grid_w // merge_size, merge_size, patch_size,
    )
    # -> (t, h_blocks, w_blocks, h_in_block, w_in_block, channel, temporal, patch_y, patch_x)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    return flat, (grid_t, grid_h, grid_w)

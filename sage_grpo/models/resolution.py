"""Video sizes: the reference's 16:9 buckets (docs/reference.md#the-rollout; the table is
``sage_grpo.config.train.RESOLUTION_BUCKETS``) and other aspect ratios. ``HxW`` flags are parsed by
``sage_grpo.config.validation.parse_size``.

Rollouts use ``bucket_hw(480)`` = 352x624 (81 frames). ``generate.py`` maps ``--resolution`` to a bucket base size
(480p -> 640 -> 480x864, the size ``run_inference.sh`` fixes; 720p -> 960 -> 720x1280) and, for aspect ratios other
than 16:9, picks the closest-ratio size of diffusers' HunyuanVideo-1.5 crop-size buckets for that base.

Departure: an unknown bucket base raises ValueError (the reference silently falls back to 352x624).
"""

import re
from typing import Dict, Tuple

from sage_grpo.config.train import RESOLUTION_BUCKETS

DEFAULT_BUCKET_BASE = 480
RESOLUTION_BUCKET_BASE: Dict[str, int] = {"480p": 640, "720p": 960}


def bucket_hw(base_size: int = DEFAULT_BUCKET_BASE) -> Tuple[int, int]:
    """(H, W) of the 16:9 bucket for ``base_size`` (480 -> 352x624)."""
    if base_size not in RESOLUTION_BUCKETS:
        raise ValueError(f"unknown bucket base size {base_size}; choose one of {sorted(RESOLUTION_BUCKETS)}")
    return RESOLUTION_BUCKETS[base_size]


def parse_aspect_ratio(text: str) -> Tuple[int, int]:
    """``"16:9"`` -> (16, 9) (width : height)."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text or "")
    if not match or int(match.group(1)) <= 0 or int(match.group(2)) <= 0:
        raise ValueError(f"aspect ratio must look like W:H with positive integers (e.g. 16:9), got {text!r}")
    return int(match.group(1)), int(match.group(2))


def resolution_hw(resolution: str, aspect_ratio: str = "16:9", spatial_factor: int = 16) -> Tuple[int, int]:
    """(H, W) for ``--resolution`` (480p/720p) and ``--aspect_ratio`` W:H."""
    if resolution not in RESOLUTION_BUCKET_BASE:
        raise ValueError(f"unknown resolution {resolution!r}; choose one of {sorted(RESOLUTION_BUCKET_BASE)}")
    base = RESOLUTION_BUCKET_BASE[resolution]
    width_ratio, height_ratio = parse_aspect_ratio(aspect_ratio)
    if width_ratio * 9 == height_ratio * 16:
        return bucket_hw(base)
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=spatial_factor)
    height, width = processor.calculate_default_height_width(height_ratio, width_ratio, base)
    return int(height), int(width)

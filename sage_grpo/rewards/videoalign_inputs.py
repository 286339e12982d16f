"""Turn (video, prompt) pairs into the padded Qwen2-VL batch VideoReward consumes.

Per sample, as the reference's ``prepare_batch`` + Qwen2-VL processor do it (one video at a time there, a padded
batch here):

* video: sample, resize and normalise the frames (``video_preprocess``), flatten into patches, record
  ``video_grid_thw = (grid_t, grid_h, grid_w)``;
* text: the chat template renders ``[video, build_prompt(prompt)]`` as one user turn plus the generation prompt;
  the single ``<|video_pad|>`` is expanded to ``grid_t * grid_h * grid_w / merge_size**2`` copies (one per
  merged visual token). The three reward tokens already sit inside the ``detailed_special`` text;
* batch: right padding with the tokenizer's pad id, ``attention_mask``, and ``mm_token_type_ids`` (0 text,
  2 video) which transformers 5 needs for multimodal RoPE.

Expanding the placeholder after tokenisation is equivalent to the processor's string expansion because
``<|video_pad|>`` is an added special token: the tokenizer never merges across it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .prompt_templates import build_prompt
from .video_preprocess import (
    FRAME_FACTOR,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PROCESSOR_MAX_PIXELS,
    PROCESSOR_MIN_PIXELS,
    VIDEO_MIN_PIXELS,
    normalize_frames,
    num_sampled_frames,
    patchify_video,
    processor_resize,
    processor_smart_resize,
    resize_frames,
    sample_frame_indices,
    smart_resize,
)

VIDEO_TOKEN = "<|video_pad|>"
VIDEO_TOKEN_TYPE = 2  # mm_token_type_ids: 0 text, 1 image, 2 video
MIN_FRAME_PIXELS = 28 * 28  # one merged 2x2 patch of 14x14 pixels: the smallest frame Qwen2-VL can take


@dataclass(frozen=True)
class VideoInputSpec:
    """How frames are sampled and cut into patches (checkpoint ``data_config`` + base-model vision config)."""

    fps: float | None = 2.0  # frames per second fed to the model; ignored when ``num_frames`` is set
    num_frames: int | None = None
    max_pixels: int = 240 * 320  # data_config.max_frame_pixels
    min_pixels: int = VIDEO_MIN_PIXELS  # qwen-vl-utils' (VideoAlign never sets it)
    processor_min_pixels: int = PROCESSOR_MIN_PIXELS  # the Qwen2-VL processor's own budget, applied second
    processor_max_pixels: int = PROCESSOR_MAX_PIXELS
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD


@dataclass(frozen=True)
class SamplingOverrides:
    """``--videoalign_fps`` / ``--videoalign_num_frames`` / ``--videoalign_max_pixels``: what the reward model sees,
    overriding the checkpoint's ``data_config`` (``fps``, ``num_frames``, ``max_frame_pixels``); None keeps the
    checkpoint's value. ``fps`` and ``num_frames`` are two ways to say the same thing and exclude each other."""

    fps: float | None = None  # frames per second of video time fed to the model
    num_frames: int | None = None  # a fixed frame count (rounded to even, capped at the video's)
    max_pixels: int | None = None  # pixel budget of one resized frame (height x width)

    def __post_init__(self):
        if self.fps is not None and self.num_frames is not None:
            raise ValueError(f"videoalign_fps {self.fps} and videoalign_num_frames {self.num_frames} both set; they "
                             "are exclusive (sampling at a rate or a fixed count): give one of them")
        if self.fps is not None and not (self.fps > 0 and math.isfinite(self.fps)):
            raise ValueError(f"videoalign_fps must be a positive number, got {self.fps} (VideoAlign's default is 2.0)")
        if self.num_frames is not None and self.num_frames < FRAME_FACTOR:
            raise ValueError(f"videoalign_num_frames must be >= {FRAME_FACTOR} (one temporal patch), got "
                             f"{self.num_frames}")
        if self.max_pixels is not None and self.max_pixels < MIN_FRAME_PIXELS:
            raise ValueError(f"videoalign_max_pixels must be >= {MIN_FRAME_PIXELS} (one 28x28 merged patch), got "
                             f"{self.max_pixels}; the released checkpoint uses 200704 (448x448)")

    def apply(self, spec: VideoInputSpec) -> VideoInputSpec:
        """``spec`` with the overrides set (a frame count replaces the checkpoint's rate and vice versa)."""
        changes = {}
        if self.fps is not None:
            changes.update(fps=self.fps, num_frames=None)
        if self.num_frames is not None:
            changes.update(fps=None, num_frames=self.num_frames)
        if self.max_pixels is not None:
            changes.update(max_pixels=self.max_pixels)
        if "max_pixels" in changes and changes["max_pixels"] < spec.min_pixels:
            raise ValueError(f"videoalign_max_pixels {self.max_pixels} is below the checkpoint's minimum frame size "
                             f"{spec.min_pixels} pixels; use at least {spec.min_pixels}")
        return dataclasses.replace(spec, **changes)


class FrameSampler:
    """Picks and resizes the frames the reward model sees (the video half of :class:`VideoAlignInputBuilder`,
    usable without a tokenizer)."""

    def __init__(self, spec: VideoInputSpec):
        self.spec = spec

    # The sampled frames are picked before anything else touches the video: every later step (dtype conversion,
    # clamp, scaling to [0, 255], resize) is per frame, so picking first gives bit-identical frames while the
    # full-size work shrinks from F frames to the T sampled ones (81 -> 6 for a 480p rollout).
    def frame_indices(self, total_frames: int, video_fps: float) -> list[int]:
        """Indices of the frames the reward model sees among ``total_frames`` frames at ``video_fps``."""
        count = num_sampled_frames(total_frames, video_fps, fps=self.spec.fps, nframes=self.spec.num_frames)
        return sample_frame_indices(total_frames, count)

    def resize(self, frames: torch.Tensor, *, quantize: bool) -> torch.Tensor:
        """Sampled ``(T, 3, H, W)`` frames in [0, 255] -> ``(T, 3, h, w)``: qwen-vl-utils' resize to the spec's
        pixel budget, then the processor's to its own budget (a no-op when the first already fits it)."""
        factor = self.spec.patch_size * self.spec.merge_size
        _, _, height, width = frames.shape
        size = smart_resize(height, width, factor=factor, min_pixels=self.spec.min_pixels,
                            max_pixels=self.spec.max_pixels)
        if min(size) == 0:  # qwen-vl-utils' shrink floors the short side of an extreme aspect ratio to 0
            raise ValueError(f"a {height}x{width} video shrinks to {size[0]}x{size[1]} under the pixel budget "
                             f"{self.spec.max_pixels}; give a less extreme aspect ratio or a larger videoalign_max_pixels")
        frames = resize_frames(frames, size, quantize=quantize)
        second = processor_smart_resize(*size, factor=factor, min_pixels=self.spec.processor_min_pixels,
                                        max_pixels=self.spec.processor_max_pixels)
        return frames if second == size else processor_resize(frames, second)

    def frames_from_tensor(self, video: torch.Tensor, video_fps: float) -> torch.Tensor:
        """A decoded rollout ``(3, F, H, W)`` in [0, 1] (or uint8 in [0, 255]: the same frames, since float32's
        ``k / 255 * 255`` is ``k`` for every level) -> prepared frames (no uint8 quantisation)."""
        picked = video.detach()[:, self.frame_indices(video.shape[1], video_fps)]  # (3, T, H, W)
        frames = picked.permute(1, 0, 2, 3).float().contiguous()
        if video.is_floating_point():
            frames.clamp_(0.0, 1.0).mul_(255.0)
        return self.resize(frames, quantize=False)

    def frames_from_uint8(self, frames: torch.Tensor, video_fps: float) -> torch.Tensor:
        """Decoded file frames ``(F, H, W, 3)`` uint8 -> prepared frames (resize rounded back to uint8 levels)."""
        picked = frames[self.frame_indices(frames.shape[0], video_fps)]  # (T, H, W, 3)
        # contiguous (T, 3, H, W): the bicubic kernel is ~20% faster on it than on the channels-last view, same values
        return self.resize(picked.permute(0, 3, 1, 2).contiguous().float(), quantize=True)


class VideoAlignInputBuilder(FrameSampler):
    """Builds model inputs from decoded videos or video files; holds the tokenizer and chat template."""

    def __init__(self, tokenizer, chat_template: str, spec: VideoInputSpec, template_type: str):
        super().__init__(spec)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_type = template_type
        self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
        self.pad_token_id = tokenizer.pad_token_id
        if self.pad_token_id is None:
            raise ValueError("the reward tokenizer has no pad token; right padding and 'last' pooling need one")

    # ---- video -------------------------------------------------------------------------------------------
    def patchify(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        normalized = normalize_frames(frames, self.spec.image_mean, self.spec.image_std)
        return patchify_video(
            normalized,
            patch_size=self.spec.patch_size,
            temporal_patch_size=self.spec.temporal_patch_size,
            merge_size=self.spec.merge_size,
        )

    # ---- text --------------------------------------------------------------------------------------------
    def render_chat(self, prompt: str) -> str:
        messages = [{
            "role": "user",
            "content": [{"type": "video"}, {"type": "text", "text": build_prompt(prompt, self.template_type)}],
        }]
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
        )

    def prompt_token_ids(self, prompt: str, num_video_tokens: int) -> list[int]:
        ids = self.tokenizer(self.render_chat(prompt))["input_ids"]
        slots = [i for i, token in enumerate(ids) if token == self.video_token_id]
        if len(slots) != 1:
            raise ValueError(f"chat template produced {len(slots)} {VIDEO_TOKEN} tokens, expected exactly 1")
        slot = slots[0]
        return ids[:slot] + [self.video_token_id] * num_video_tokens + ids[slot + 1:]

    # ---- batch -------------------------------------------------------------------------------------------
    def build(self, frames_per_video: list[torch.Tensor], prompts: list[str]) -> dict[str, torch.Tensor]:
        """Prepared frames + prompts -> ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (B, L),
        ``pixel_values_videos`` (sum of patches, C*tp*p*p) and ``video_grid_thw`` (B, 3)."""
        if len(frames_per_video) != len(prompts):
            raise ValueError(f"{len(frames_per_video)} videos but {len(prompts)} prompts")
        patches, grids, sequences = [], [], []
        for frames, prompt in zip(frames_per_video, prompts):
            flat, grid = self.patchify(frames)
            patches.append(flat)
            grids.append(grid)
            num_video_tokens = grid[0] * grid[1] * grid[2] // self.spec.merge_size**2
            sequences.append(self.prompt_token_ids(prompt, num_video_tokens))
        length = max(len(seq) for seq in sequences)
        input_ids = torch.full((len(sequences), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, seq in enumerate(sequences):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[row, : len(seq)] = 1
        mm_token_type_ids = torch.where(input_ids == self.video_token_id, VIDEO_TOKEN_TYPE, 0)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "mm_token_type_ids": mm_token_type_ids.masked_fill(attention_mask == 0, 0),
            "pixel_values_videos": torch.cat(patches, dim=0),
            "video_grid_thw": torch.tensor(grids, dtype=torch.long),
        }

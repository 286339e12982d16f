"""The image condition of HunyuanVideo-1.5 image-to-video (docs/reference.md#reference-means,
docs/reference.md#the-rollout-pipeline; diffusers' ``HunyuanVideo15ImageToVideoPipeline``), built from the reference
image of each sample:

- the reference frame, resized to cover the video size and centre-cropped to it (diffusers' ``resize_mode="crop"``),
  VAE-encoded as a one-frame video (the posterior's mode) and scaled by the VAE's scaling factor: ``latents``
  (B, C, 1, h, w). The transformer sees it as the condition channels of the *first* latent frame, zeros after it,
  plus the i2v task mask (1 on the first latent frame, 0 elsewhere)::

      hidden_states = cat([x_t, [z_ref, 0, ..., 0], [1, 0, ..., 0]], dim=1)        # (B, 2C+1, T, h, w)

- the SigLIP vision states of the same cropped image (the processor resizes it to the encoder's size):
  ``embeds`` (B, N_img, D_img), fed as ``image_embeds`` instead of the text-to-video zeros. They are not all zero,
  so the transformer keeps them as valid tokens (first in its text-stream order, so the attention's trim keeps them).

:class:`ImageCondition` rides on :class:`~sage_grpo.models.text_encoding.PromptEmbeds` (its ``image`` field), so the
rollout, the replay, the reference means and sequence parallelism select and move it with the prompts: the condition a
transition is replayed with is the one it was sampled with, bit for bit. One transformer call must be all
image-to-video or all text-to-video: diffusers decides the task of a call from ``all(image_embeds == 0)`` over the
whole batch, which a batch of PromptEmbeds guarantees (the field is set for every row or for none).
"""

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor


@dataclass
class ImageCondition:
    """The image condition of B samples (row i belongs to sample i)."""

    latents: Tensor  # (B, C, 1, h, w) scaled VAE latent of the reference frame
    embeds: Tensor  # (B, N_img, D_img) SigLIP last hidden states

    def __len__(self) -> int:
        return self.latents.shape[0]

    def select(self, indices) -> "ImageCondition":
        """Rows ``indices``: a LongTensor or a slice (PromptEmbeds.select converts lists)."""
        if isinstance(indices, Tensor):
            indices = indices.to(self.latents.device)
        return ImageCondition(self.latents[indices], self.embeds[indices])

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "ImageCondition":
        return ImageCondition(self.latents.to(device=device, dtype=dtype), self.embeds.to(device=device, dtype=dtype))

    @classmethod
    def cat(cls, parts: Sequence["ImageCondition"]) -> "ImageCondition":
        return cls(torch.cat([p.latents for p in parts]), torch.cat([p.embeds for p in parts]))

    def condition_channels(self, num_frames: int, dtype: torch.dtype) -> Tensor:
        """(B, C+1, T, h, w): the reference latent on the first latent frame, zeros after it, and the task mask."""
        batch, channels, _, height, width = self.latents.shape
        condition = self.latents.new_zeros(batch, channels + 1, num_frames, height, width, dtype=dtype)
        condition[:, :channels, :1] = self.latents.to(dtype)
        condition[:, channels, 0] = 1.0
        return condition


def load_image(path: Union[str, Path]):
    """The RGB PIL image at ``path`` (loaded fully; a file that cannot be decoded raises)."""
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def image_size(path: Union[str, Path]) -> Tuple[int, int]:
    """(height, width) of the image at ``path``, from its header."""
    from PIL import Image

    with Image.open(path) as image:
        return image.height, image.width


def closest_bucket(image_hw: Tuple[int, int], base_size: int, spatial_factor: int = 16) -> Tuple[int, int]:
    """(H, W) of the crop-size bucket of ``base_size`` whose aspect ratio is closest to the image's (diffusers'
    HunyuanVideo-1.5 buckets, the ones its image-to-video pipeline picks with the transformer's ``target_size``)."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=spatial_factor)
    height, width = processor.calculate_default_height_width(image_hw[0], image_hw[1], base_size)
    return int(height), int(width)


class ImageConditionEncoder:
    """Builds :class:`ImageCondition` rows from image files with the SigLIP encoder, its processor and the VAE.

    Each distinct (file, size) is encoded once and kept on the CPU, in the encoders' dtype, like the prompt cache: a
    prompt group shares one image, and the prompt comes back every epoch (released model, bf16: about 1.8 MB per image
    at 352x624, mostly the 729 x 1152 SigLIP states). The cache holds at most ``max_cache_bytes`` (``None``: no
    limit, 0: no cache); past that the least recently used conditions are dropped and re-encoded when they come back,
    which gives the same tensors. ``compute_device``: where the SigLIP encoder runs when it lives elsewhere (offloaded
    with the text encoders)."""

    def __init__(self, image_encoder, feature_extractor, vae, *,
                 compute_device: Optional[Union[str, torch.device]] = None, max_cache_bytes: Optional[int] = None):
        from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

        self.image_encoder, self.feature_extractor, self.vae = image_encoder, feature_extractor, vae
        self.compute_device = torch.device(compute_device) if compute_device is not None else None
        # the pipeline's own processor settings: no resize to multiples (the size is a bucket), RGB
        self.video_processor = HunyuanVideo15ImageProcessor(
            vae_scale_factor=vae.config.spatial_compression_ratio, do_resize=False, do_convert_rgb=True)
        self.max_cache_bytes = max_cache_bytes
        self._cache: "OrderedDict[Tuple[str, int, int], Tuple[Tensor, Tensor]]" = OrderedDict()
        self._cache_bytes = 0

    @contextlib.contextmanager
    def _encoder_on_device(self) -> Iterator[torch.device]:
        home = next(self.image_encoder.parameters()).device
        if self.compute_device is None or self.compute_device == home:
            yield home
            return
        try:
            self.image_encoder.to(self.compute_device)
            yield self.compute_device
        finally:
            self.image_encoder.to(home)

    @torch.no_grad()
    def encode_image(self, image, height: int, width: int) -> Tuple[Tensor, Tensor]:
        """(latent (1, C, 1, h, w), SigLIP states (1, N_img, D_img)) of one PIL image at video size ``height x width``,
        on the CPU in the VAE's and the encoder's dtypes (the transformer call casts them to its own, as diffusers)."""
        image = self.video_processor.resize(image, height=height, width=width, resize_mode="crop")
        vae_device = next(self.vae.parameters()).device
        pixels = self.video_processor.preprocess(image, height=height, width=width)  # (1, 3, H, W) in [-1, 1]
        posterior = self.vae.encode(pixels.to(vae_device, self.vae.dtype).unsqueeze(2)).latent_dist
        latent = posterior.mode() * self.vae.config.scaling_factor
        with self._encoder_on_device() as device:
            inputs = self.feature_extractor.preprocess(images=image, do_resize=True, return_tensors="pt",
                                                       do_convert_rgb=True)
            pixel_values = inputs["pixel_values"].to(device, self.image_encoder.dtype)
            states = self.image_encoder(pixel_values=pixel_values).last_hidden_state
        return latent.cpu(), states.cpu()

    def encode(self, paths: Sequence[Union[str, Path]], height: int, width: int) -> ImageCondition:
        """The condition of one sample per path (repeated paths are encoded once), on the CPU."""
        rows, fresh = [], {}
        for path in paths:
            key = (str(path), int(height), int(width))
            if key in self._cache:
                self._cache.move_to_end(key)
                rows.append(self._cache[key])
            else:
                if key not in fresh:
                    fresh[key] = self.encode_image(load_image(path), height, width)
                rows.append(fresh[key])
        for key, row in fresh.items():
            self._remember(key, row)
        return ImageCondition(torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows]))

    def _remember(self, key: Tuple[str, int, int], row: Tuple[Tensor, Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in row)
        limit = self.max_cache_bytes
        if limit is not None and size > limit:
            return
        self._cache[key] = row
        self._cache_bytes += size
        while limit is not None and self._cache_bytes > limit:
            _, dropped = self._cache.popitem(last=False)
            self._cache_bytes -= sum(t.numel() * t.element_size() for t in dropped)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the conditions held now."""
        return self._cache_bytes

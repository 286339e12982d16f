"""What the parallel layout rules need to know of a checkpoint, read from its config files without loading weights.

``sage_grpo/distributed/`` decides how to split the models; this module, which knows the checkpoint's layout, tells
it the number of attention heads (Ulysses splits them) and the image tokens of one video (Ulysses splits those too).

Its functions read the ``model`` section (which checkpoint), and for the run's video sizes the ``rollout`` and
``validation`` sections, of the configuration they are handed (:class:`ModelOptions`, :class:`GeometryOptions`).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Protocol, Tuple

from sage_grpo.config.train import ModelConfig
from sage_grpo.config.validation import ConfigError, VideoSizeOptions, rollout_size, validation_size
from sage_grpo.models import layout
from sage_grpo.models.config_fields import read_model_config


def _read_config(path: Path, component: str) -> Optional[dict]:
    return read_model_config(path, component) if path.is_file() else None


def video_tokens(vae_config: dict, transformer_config: dict, num_frames: int, height: int, width: int) -> int:
    """Image tokens of one video in the transformer: the VAE's latent (T, h, w) divided by the patch sizes (a field
    a config leaves out is the class's default)."""
    latent_frames = (num_frames - 1) // vae_config.get("temporal_compression_ratio", 4) + 1
    spatial = vae_config.get("spatial_compression_ratio", 16)
    patch, patch_t = transformer_config.get("patch_size", 1), transformer_config.get("patch_size_t", 1)
    return (latent_frames // patch_t) * (height // spatial // patch) * (width // spatial // patch)


@dataclass(frozen=True)
class ModelGeometry:
    """What the parallel layout rules need from the model, read from its config files (no weights loaded)."""

    num_attention_heads: int
    video_tokens: Dict[str, int]  # "rollout" (and "validation" when validation runs) -> image tokens per video


class ModelOptions(Protocol):
    """What names the checkpoint: the configuration's ``model`` section (declared by shape)."""

    model: ModelConfig


class GeometryOptions(ModelOptions, VideoSizeOptions, Protocol):
    """The checkpoint and the run's video sizes: the ``model``, ``rollout`` and ``validation`` sections."""


def _configs(model: ModelConfig) -> Optional[Tuple[Dict, Dict]]:
    """(transformer, VAE) configs of the checkpoint ``model`` names; None when either file is missing."""
    root = Path(model.pretrained_model_root)
    transformer = _read_config(root / layout.transformer_layout(model.pretrained_transformer_version).subdir
                               / "config.json", "transformer")
    vae = _read_config(root / layout.VAE.subdir / "config.json", "vae")
    return None if transformer is None or vae is None else (transformer, vae)


def video_tokens_at(cfg: ModelOptions, num_frames: int, height: int, width: int) -> Optional[int]:
    """Image tokens of one video of the configured checkpoint at this size (an image-to-video bucket); None when a
    config file is missing."""
    configs = _configs(cfg.model)
    if configs is None:
        return None
    transformer, vae = configs
    return video_tokens(vae, transformer, num_frames, height, width)


def read_model_geometry(cfg: GeometryOptions) -> Optional[ModelGeometry]:
    """The geometry of the configured checkpoint; None when a config file is missing (the loader then reports every
    missing file of the checkpoint at once)."""
    configs = _configs(cfg.model)
    if configs is None:
        return None
    transformer, vae = configs
    height, width = rollout_size(cfg)
    tokens = {"rollout": video_tokens(vae, transformer, cfg.rollout.sample_n_frames, height, width)}
    if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0:
        tokens["validation"] = video_tokens(vae, transformer, cfg.validation.validate_video_length,
                                            *validation_size(cfg))
    return ModelGeometry(transformer.get("num_attention_heads", 16), tokens)


def check_video_sizes(cfg: GeometryOptions) -> None:
    """The rollout (and validation) size and frame count against the checkpoint's VAE compression and the
    transformer's patch size, from the config files: checked at start, before an earlier run is deleted or any model
    loads (the first rollout would otherwise be the first to see them). Nothing is checked when a config file is
    missing (the loader then reports every missing file at once)."""
    from types import SimpleNamespace

    from sage_grpo.models.vae import latent_shape  # the one rule of sizes and frame counts (imports torch)

    configs = _configs(cfg.model)
    if configs is None:
        return
    transformer, vae = configs
    ratios = SimpleNamespace(temporal_compression_ratio=vae.get("temporal_compression_ratio", 4),
                             spatial_compression_ratio=vae.get("spatial_compression_ratio", 16),
                             latent_channels=vae.get("latent_channels"))
    rollout_flags = ("--rollout_height/--rollout_width" if cfg.rollout.rollout_height is not None
                     else f"--video_bucket_hw_base_size {cfg.rollout.video_bucket_hw_base_size}")
    checks = [("--sample_n_frames", cfg.rollout.sample_n_frames, f"rollout size ({rollout_flags})", rollout_size(cfg))]
    if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0:
        checks.append(("--validate_video_length", cfg.validation.validate_video_length, "validation size "
                       "(--validation_fixed_size)", validation_size(cfg)))
    patch, spatial = transformer.get("patch_size", 1), ratios.spatial_compression_ratio
    source = f"the VAE of {cfg.model.pretrained_model_root}"
    for frames_flag, frames, size_flag, (height, width) in checks:
        try:
            latent_shape(ratios, frames, spatial, spatial)
        except ValueError as err:
            raise ConfigError(f"{frames_flag} {frames}: {err} ({source})") from None
        try:
            _, _, latent_h, latent_w = latent_shape(ratios, 1, height, width)
        except ValueError as err:
            raise ConfigError(f"{size_flag} {height}x{width}: {err} ({source}). Fix: e.g. "
                              f"{height // spatial * spatial or spatial}x{width // spatial * spatial or spatial}"
                              ) from None
        if latent_h % patch or latent_w % patch:
            raise ConfigError(f"{size_flag} {height}x{width}: the transformer's patch size {patch} does not divide the "
                              f"latent size {latent_h}x{latent_w}. Fix: use multiples of "
                              f"{ratios.spatial_compression_ratio * patch}")

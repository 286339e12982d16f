"""Tiny random-weight HunyuanVideo-1.5 checkpoint: the real classes, the real layout, a few MB, written offline.

:func:`write_tiny_hunyuan` writes every component of :mod:`sage_grpo.models.layout` with the same classes as the real
checkpoint, so :func:`sage_grpo.models.loading.load_components` opens it exactly like the real one. Sizes follow the
diffusers test configs:

- transformer: 2 dual-stream blocks, 2 heads x 8 dims, ``rope_axes_dim`` (2, 2, 4) (sums to the head dim, even
  entries), 4 latent channels so ``in_channels = 2*4 + 1 = 9`` (latent, zero condition, zero mask). About 4.3M
  parameters, nearly all in the byT5 projection whose hidden width (2048) diffusers hard-codes.
- VAE: 4 latent channels, the real ratios' shape (temporal 4: 81 frames -> 21 latent frames) but spatial 8 instead
  of 16, so tiny test videos still have a few latent pixels.
- text encoder: a 3-layer Qwen2.5-VL text model (the pipeline reads hidden state -3, so with 3 layers that is the
  output of the first block, not the bare embeddings) on a byte-level BPE tokenizer trained here on a small corpus,
  with Qwen's chat template and special tokens; byT5: a 2-layer T5 encoder with ``ByT5Tokenizer`` (needs no files).

Image-to-video versions (``480p_i2v``, ...) get the transformer config with ``task_type="i2v"``, and the root then
also holds a tiny SigLIP image encoder (``SiglipVisionModel``: 1 layer, hidden size = the transformer's
``image_embed_dim``, 16x16 pixels in 8x8 patches -> 4 image tokens) with its ``SiglipImageProcessor`` config
(16x16, SigLIP's 0.5/0.5 normalisation), the components diffusers' ``HunyuanVideo15ImageToVideoPipeline`` takes.
The step-distilled ``480p_i2v_step_distilled`` gets ``use_meanflow=True`` (a second time embedder for
``timestep_r``), as diffusers' conversion script configures it.

Weights are drawn under a forked RNG seeded by ``seed`` (so a seed gives byte-identical files and the caller's global
RNG is untouched) and saved in bf16, like the released checkpoint. Each transformer version gets its own seed offset
and, as in the diffusers pipeline repos, its own ``variants/<version>/`` guider and scheduler configs: guidance 1.0
for a cfg-distilled version (a name ending in ``_distilled``), else 6.0; the known version's shift (else 5.0).
"""

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch

from sage_grpo.config.validation import FLOW_SHIFT_BY_VERSION, MEANFLOW_VERSIONS
from sage_grpo.models import layout
from sage_grpo.models.tiny_tokenizer import build_tiny_qwen_tokenizer

TINY_TRANSFORMER_CONFIG: Dict = dict(
    in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2, num_refiner_layers=1,
    mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
    rope_axes_dim=(2, 2, 4), target_size=64, task_type="t2v",
)
TINY_VAE_CONFIG: Dict = dict(
    latent_channels=4, block_out_channels=(8, 8, 16, 16), layers_per_block=1, spatial_compression_ratio=8,
    temporal_compression_ratio=4, downsample_match_channel=False, upsample_match_channel=False,
)
TINY_FLOW_SHIFT = 5.0
BASE_GUIDANCE, DISTILLED_GUIDANCE = 6.0, 1.0  # HunyuanVideo-1.5's guider configs: base and cfg-distilled versions

_TOKENIZER_CORPUS = (
    "You are a helpful assistant. Describe the video by detailing the following aspects: 1. The main content and "
    "theme of the video. 2. The color, shape, size, texture, quantity, text, and spatial relationships of the "
    "objects. 3. Actions, events, behaviors temporal relationships, physical movement changes of the objects. "
    "4. background environment, light, style and atmosphere. 5. camera angles, movements, and transitions used in "
    "the video. A cat walks on the grass, realistic. The video shows a dog running on a beach at sunset. "
    'A girl holding a paper with words "Hello, world!" in a sunny park.'
)


def _tiny_text_encoder(tokenizer):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=TINY_TRANSFORMER_CONFIG["text_embed_dim"], intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
        rope_parameters={"mrope_section": [1, 1, 2], "rope_type": "default", "rope_theta": 1e6},
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2_5_VLTextModel(config)


def _tiny_text_encoder_2():
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=384, d_model=TINY_TRANSFORMER_CONFIG["text_embed_2_dim"], d_kv=8, d_ff=37,
                      num_layers=2, num_heads=4, relative_attention_num_buckets=8, is_encoder_decoder=False,
                      use_cache=False)
    return T5EncoderModel(config)


TINY_IMAGE_SIZE, TINY_IMAGE_PATCH = 16, 8


def _tiny_image_encoder(image_embed_dim: int):
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(hidden_size=image_embed_dim, intermediate_size=2 * image_embed_dim,
                                num_hidden_layers=1, num_attention_heads=2, image_size=TINY_IMAGE_SIZE,
                                patch_size=TINY_IMAGE_PATCH)
    return SiglipVisionModel(config)


def _write_tiny_image_encoder(root: Path, image_embed_dim: int, seed: int, dtype: torch.dtype) -> None:
    from transformers import SiglipImageProcessor

    _save(_seeded(lambda: _tiny_image_encoder(image_embed_dim), seed), root / layout.IMAGE_ENCODER.subdir, dtype)
    processor = SiglipImageProcessor(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    processor.save_pretrained(root / layout.FEATURE_EXTRACTOR.subdir)


def _save(module, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Save in ``dtype`` (``nn.Module.to`` skips diffusers' override, which warns about fp32-kept modules: none here)."""
    from transformers.utils import logging as hf_logging

    torch.nn.Module.to(module, dtype)
    progress_bar_was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        module.save_pretrained(folder)
    finally:
        if progress_bar_was_enabled:
            hf_logging.enable_progress_bar()


def published_sampling(version: str) -> Tuple[float, float]:
    """(guidance scale, flow shift) that HunyuanVideo-1.5's pipeline repos give ``version``: CFG 1.0 for the
    cfg-distilled versions, 6.0 otherwise; the known version's shift, else the tiny scheduler's."""
    guidance = DISTILLED_GUIDANCE if version.endswith("_distilled") else BASE_GUIDANCE
    return guidance, FLOW_SHIFT_BY_VERSION.get(version, TINY_FLOW_SHIFT)


def write_variant_configs(root, version: str, guidance_scale: float, shift: float) -> None:
    """``<root>/variants/<version>/``: the version's guider and scheduler configs, as diffusers saves them."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler
    from diffusers.utils import logging as diffusers_logging

    guider_layout, scheduler_layout = layout.variant_config_layouts(version)
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # the guider's "experimental feature" notice
    try:
        ClassifierFreeGuidance(guidance_scale=guidance_scale).save_config(Path(root) / guider_layout.subdir)
    finally:
        diffusers_logging.set_verbosity(level)
    FlowMatchEulerDiscreteScheduler(shift=shift).save_pretrained(Path(root) / scheduler_layout.subdir)


def _seeded(build, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def write_tiny_hunyuan(root, *, seed: int = 0, versions: Sequence[str] = (layout.DEFAULT_TRANSFORMER_VERSION,),
                       transformer_config: Optional[Dict] = None, vae_config: Optional[Dict] = None,
                       tokenizer_corpus: str = "", dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a complete tiny checkpoint under ``root`` (created if needed) and return ``root`` as a Path.

    ``transformer_config``/``vae_config`` replace the tiny configs (the toy world's checkpoint uses wider ones),
    ``tokenizer_corpus`` is added to the tokenizer's training text and ``dtype`` is the dtype the weights are saved in.
    """
    transformer_config = transformer_config or TINY_TRANSFORMER_CONFIG
    vae_config = vae_config or TINY_VAE_CONFIG
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from transformers import ByT5Tokenizer

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for offset, version in enumerate(versions):
        config = dict(transformer_config, use_meanflow=version in MEANFLOW_VERSIONS)
        if layout.version_task(version) == "i2v":
            config["task_type"] = "i2v"
        transformer = _seeded(lambda: HunyuanVideo15Transformer3DModel(**config), seed + 100 + offset)
        _save(transformer, root / layout.transformer_layout(version).subdir, dtype)
        write_variant_configs(root, version, *published_sampling(version))
    _save(_seeded(lambda: AutoencoderKLHunyuanVideo15(**vae_config), seed + 1), root / layout.VAE.subdir, dtype)

    tokenizer = build_tiny_qwen_tokenizer([_TOKENIZER_CORPUS + tokenizer_corpus] * 20, vocab_size=400)
    tokenizer.save_pretrained(root / layout.TOKENIZER.subdir)
    _save(_seeded(lambda: _tiny_text_encoder(tokenizer), seed + 2), root / layout.TEXT_ENCODER.subdir, dtype)
    ByT5Tokenizer().save_pretrained(root / layout.TOKENIZER_2.subdir)
    _save(_seeded(_tiny_text_encoder_2, seed + 3), root / layout.TEXT_ENCODER_2.subdir, dtype)

    FlowMatchEulerDiscreteScheduler(shift=TINY_FLOW_SHIFT).save_pretrained(root / layout.SCHEDULER.subdir)
    if any(layout.version_task(version) == "i2v" for version in versions):
        _write_tiny_image_encoder(root, transformer_config["image_embed_dim"], seed + 4, dtype)
    return root

"""Real-width, reduced-depth random-weight HunyuanVideo-1.5 checkpoint, for benchmarks at the real width.

:func:`write_real_width_hunyuan` writes the layout of :mod:`sage_grpo.models.layout` (what
:func:`~sage_grpo.models.write_tiny_hunyuan` writes and the trainer and ``generate.py`` load) with:

- transformer: HunyuanVideo-1.5's ``480p_t2v`` configuration (:data:`REAL_TRANSFORMER_CONFIG`: diffusers'
  ``HunyuanVideo15Transformer3DModel`` defaults, hidden 2048 = 16 heads x 128, MLP ratio 4, 2 refiner layers,
  3584-wide MLLM text, 1472-wide byT5 glyphs) with ``num_layers`` of its 54 dual-stream blocks (each 151M
  parameters; 1 block: 321M in all, 54 blocks: 8.33B);
- VAE: ``real`` is the released configuration (:data:`REAL_VAE_CONFIG`, diffusers' ``AutoencoderKLHunyuanVideo15``
  defaults, 1.26B parameters), so a decode at 81 x 352 x 624 costs what the real one costs; ``narrow`` keeps the real
  latent channels (32) and ratios (16 spatial, 4 temporal) on 8- to 64-channel layers (:data:`NARROW_VAE_CONFIG`),
  for CPU tests that need the latent shapes only;
- text encoders: tiny (a 3-layer Qwen2.5-VL text model on the tiny byte-level tokenizer, a 2-layer byT5) whose output
  widths are the real ones the transformer's text projections take (3584 and 1472), so the real projections run;
- the tiny VideoAlign reward (:mod:`sage_grpo.rewards.tiny`) under ``VideoReward/``.

Random weights are not initialised by the modules (8.33B parameters of ``kaiming_uniform_`` in fp32 would take
minutes): each model is built on the ``meta`` device in bf16, given empty CPU storage and filled under a generator
seeded by ``seed``: every weight of two or more dimensions from N(0, σ²) with σ = min(0.02, fan_in^-½) (0.02 on the
transformer's 2048-wide layers; the VAE's 3x3x3 convolutions, fan-in up to 27,648, get less so activations stay
finite through its 30-odd convolutions), norm scales 1, biases and other vectors 0 except the transformer's 1-D
weights outside norms (N(0, 0.02²)). A seed gives byte-identical files. The weights are saved in bf16, sharded by
``save_pretrained`` where large.
"""

from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from sage_grpo.models import layout
from sage_grpo.models.tiny import _TOKENIZER_CORPUS, _save, published_sampling, write_variant_configs

# HunyuanVideo-1.5 480p_t2v (diffusers' HunyuanVideo15Transformer3DModel defaults, task t2v).
REAL_TRANSFORMER_CONFIG: Dict = dict(
    in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
    num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=3584,
    text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0, rope_axes_dim=(16, 56, 56), target_size=640,
    task_type="t2v",
)
# The released VAE (diffusers' AutoencoderKLHunyuanVideo15 defaults): 1.26B parameters.
REAL_VAE_CONFIG: Dict = dict(
    latent_channels=32, block_out_channels=(128, 256, 512, 1024, 1024), layers_per_block=2,
    spatial_compression_ratio=16, temporal_compression_ratio=4, downsample_match_channel=True,
    upsample_match_channel=True,
)
# The real VAE's latent channels and ratios on narrow layers (4.5M parameters): the latent shapes at a negligible
# cost. The widest layers hold 2 x 32 channels, as the encoder's output and the decoder's input shortcuts need.
NARROW_VAE_CONFIG: Dict = dict(
    latent_channels=32, block_out_channels=(8, 16, 32, 64, 64), layers_per_block=1, spatial_compression_ratio=16,
    temporal_compression_ratio=4, downsample_match_channel=False, upsample_match_channel=False,
)
VAE_CONFIGS: Dict[str, Dict] = {"real": REAL_VAE_CONFIG, "narrow": NARROW_VAE_CONFIG}
WEIGHT_STD = 0.02
TEXT_ENCODER_LAYERS = 3  # the pipeline reads hidden state -3: with 3 layers, the first block's output


def _fill_random(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Fill ``module``'s (uninitialised) parameters in place, in named order, from a generator seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.ndim >= 2:
                fan_in = param[0].numel()
                param.normal_(0.0, min(WEIGHT_STD, fan_in ** -0.5), generator=generator)
            elif "norm" in name:
                param.fill_(1.0 if name.endswith(("weight", "gamma")) else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, WEIGHT_STD, generator=generator)
    parameters = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    unfilled = [name for name in module.state_dict() if name not in parameters]
    if unfilled:  # a persistent buffer would be saved uninitialised
        raise ValueError(f"{type(module).__name__} has persistent buffers ({unfilled[:3]}) that random_module does "
                         "not fill; build it on the CPU instead")
    return module


def random_module(build, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """``build()`` on the meta device in ``dtype``, given CPU storage and filled by :func:`_fill_random` (no init)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            module = build()
    finally:
        torch.set_default_dtype(previous)
    return _fill_random(module.to_empty(device="cpu"), seed)


def _text_encoder(tokenizer, width: int):
    """A 3-layer Qwen2.5-VL text model of ``width`` (128-wide heads where the width allows, M-RoPE sections in
    Qwen2.5-VL-7B's proportions 1:3:3 of half the head) and a tiny MLP: the real output width at a fraction of the
    7B model's cost."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    heads = max(1, width // 128)
    half_head = width // heads // 2
    sections = [half_head // 4, 3 * half_head // 8, half_head - half_head // 4 - 3 * half_head // 8]
    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=32, num_hidden_layers=TEXT_ENCODER_LAYERS,
        num_attention_heads=heads, num_key_value_heads=1,
        rope_parameters={"mrope_section": sections, "rope_type": "default", "rope_theta": 1e6},
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2_5_VLTextModel(config)


def _byt5_encoder(width: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=384, d_model=width, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, is_encoder_decoder=False, use_cache=False,
                      tie_word_embeddings=False)  # random_module gives each parameter its own storage
    return T5EncoderModel(config)


def write_real_width_hunyuan(root, *, num_layers: int, vae_config: Optional[Dict] = None, seed: int = 0,
                             versions: Sequence[str] = (layout.DEFAULT_TRANSFORMER_VERSION,),
                             transformer_config: Optional[Dict] = None) -> Path:
    """Write the real-width checkpoint of ``num_layers`` dual-stream blocks under ``root`` (created if needed) and
    return ``root`` as a Path.

    ``vae_config``: :data:`REAL_VAE_CONFIG` (default) or :data:`NARROW_VAE_CONFIG`; ``transformer_config``: replaces
    :data:`REAL_TRANSFORMER_CONFIG` (``num_layers`` still applies). The tiny VideoReward is the caller's to add
    (:func:`sage_grpo.rewards.tiny.write_tiny_video_reward`): models never import rewards."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from transformers import ByT5Tokenizer

    from sage_grpo.models.tiny_tokenizer import build_tiny_qwen_tokenizer

    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1 (the real model has 54; e.g. 1 for a CPU test), got {num_layers}")
    base = dict(transformer_config or REAL_TRANSFORMER_CONFIG, num_layers=num_layers)
    vae_config = REAL_VAE_CONFIG if vae_config is None else vae_config
    image_versions = [version for version in versions if layout.version_task(version) == "i2v"]
    if image_versions:
        raise ValueError(f"versions {image_versions}: the real-width checkpoint has no image encoder; use "
                         "text-to-video versions (e.g. 480p_t2v), or write_tiny_hunyuan for image-to-video")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for offset, version in enumerate(versions):
        config = dict(base, task_type=layout.version_task(version))
        transformer = random_module(lambda: HunyuanVideo15Transformer3DModel(**config), seed + 100 + offset)
        _save(transformer, root / layout.transformer_layout(version).subdir)
        write_variant_configs(root, version, *published_sampling(version))
    _save(random_module(lambda: AutoencoderKLHunyuanVideo15(**vae_config), seed + 1), root / layout.VAE.subdir)

    tokenizer = build_tiny_qwen_tokenizer([_TOKENIZER_CORPUS] * 20, vocab_size=400)
    tokenizer.save_pretrained(root / layout.TOKENIZER.subdir)
    _save(random_module(lambda: _text_encoder(tokenizer, base["text_embed_dim"]), seed + 2),
          root / layout.TEXT_ENCODER.subdir)
    ByT5Tokenizer().save_pretrained(root / layout.TOKENIZER_2.subdir)
    _save(random_module(lambda: _byt5_encoder(base["text_embed_2_dim"]), seed + 3), root / layout.TEXT_ENCODER_2.subdir)
    FlowMatchEulerDiscreteScheduler(shift=published_sampling(versions[0])[1]).save_pretrained(
        root / layout.SCHEDULER.subdir)
    return root

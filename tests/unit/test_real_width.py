"""The real-width, reduced-depth checkpoint (sage_grpo/models/real_width.py): bf16 files in the project's layout that
the loader opens, seeded and fast random weights, text encoders of the transformer's text widths, and the memory
planner reading the reduced depth from it. A narrowed transformer config keeps these unit tests fast; the real width
runs in tests/unit/test_bench.py's e2e tests."""

import json

import pytest
import torch
from safetensors import safe_open

from sage_grpo.models import layout, load_components
from sage_grpo.models.real_width import (NARROW_VAE_CONFIG, REAL_TRANSFORMER_CONFIG, REAL_VAE_CONFIG, random_module,
                                         write_real_width_hunyuan)

# The real configuration's structure (refiner, patching, rope split) at 2 heads x 32 and small text widths.
NARROW = dict(REAL_TRANSFORMER_CONFIG, num_attention_heads=2, attention_head_dim=32, text_embed_dim=256,
              text_embed_2_dim=64, image_embed_dim=32, rope_axes_dim=(8, 12, 12))


def _write(root, seed=0):
    return write_real_width_hunyuan(root, num_layers=2, vae_config=NARROW_VAE_CONFIG, seed=seed,
                                    transformer_config=NARROW)


def _tensors(folder):
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            out.update({key: handle.get_tensor(key) for key in handle.keys()})
    return out


def test_written_checkpoint_loads_in_bf16_with_the_requested_depth(tmp_path):
    root = _write(tmp_path / "a")
    transformer_dir = root / layout.transformer_layout(layout.DEFAULT_TRANSFORMER_VERSION).subdir
    config = json.loads((transformer_dir / "config.json").read_text())
    assert config["num_layers"] == 2 and config["num_refiner_layers"] == 2 and config["attention_head_dim"] == 32
    weights = _tensors(transformer_dir)
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    # seeded N(0, 0.02²) matrices, unit norm scales, zero biases
    q = weights["transformer_blocks.0.attn.to_q.weight"].float()
    assert q.std().item() == pytest.approx(0.02, rel=0.05) and abs(q.mean().item()) < 1e-3
    assert torch.equal(weights["transformer_blocks.0.attn.norm_q.weight"], torch.ones(32, dtype=torch.bfloat16))
    assert not weights["transformer_blocks.0.attn.to_q.bias"].any()
    # VAE convolutions: std min(0.02, fan_in^-1/2), so the 3x3x3 x 64-channel ones get 1/sqrt(1728)
    vae = _tensors(root / layout.VAE.subdir)
    conv = next(t for k, t in vae.items() if t.ndim == 5 and t.shape[1] == 64).float()
    assert conv.std().item() == pytest.approx(min(0.02, (64 * 27) ** -0.5), rel=0.05)

    parts = load_components(root, dtype=torch.float32)
    assert len(parts.transformer.transformer_blocks) == 2
    # the text encoders emit what the transformer's text projections take
    assert parts.text_encoder.config.hidden_size == NARROW["text_embed_dim"]
    assert parts.text_encoder_2.config.d_model == NARROW["text_embed_2_dim"]
    assert parts.vae.config.latent_channels == 32 and parts.vae.config.spatial_compression_ratio == 16


def test_a_seed_gives_identical_files(tmp_path):
    first, second, other = _write(tmp_path / "a"), _write(tmp_path / "b"), _write(tmp_path / "c", seed=1)
    subdir = layout.transformer_layout(layout.DEFAULT_TRANSFORMER_VERSION).subdir
    a, b, c = (_tensors(root / subdir) for root in (first, second, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["proj_out.weight"], c["proj_out.weight"])
    for sub in (layout.VAE.subdir, layout.TEXT_ENCODER.subdir):
        x, y = _tensors(first / sub), _tensors(second / sub)
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_planner_reads_the_reduced_depth(tmp_path):
    """read_model_sizes takes the transformer and VAE sizes from the written configs: the parameters of the loaded
    models, not the released 8.33B and 1.26B."""
    from sage_grpo.plan.sizes import read_model_sizes

    root = _write(tmp_path / "a")
    sizes = read_model_sizes(str(root), layout.DEFAULT_TRANSFORMER_VERSION, False)
    parts = load_components(root, dtype=torch.float32, load_text_encoders=False)
    assert sizes.transformer.num_params == sum(p.numel() for p in parts.transformer.parameters())
    assert sizes.transformer.config["num_layers"] == 2
    assert sizes.vae_params == sum(p.numel() for p in parts.vae.parameters())
    assert "released" not in sizes.sources["transformer"] and "released" not in sizes.sources["vae"]


def test_real_configs_are_the_released_sizes():
    """1 block of the real transformer is 321M parameters and each further block 151M (54: 8.33B); the VAE config is
    diffusers' defaults (1.26B), the planner's released VAE."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    def count(build):
        with torch.device("meta"):
            return sum(p.numel() for p in build().parameters())

    one = count(lambda: HunyuanVideo15Transformer3DModel(**dict(REAL_TRANSFORMER_CONFIG, num_layers=1)))
    two = count(lambda: HunyuanVideo15Transformer3DModel(**dict(REAL_TRANSFORMER_CONFIG, num_layers=2)))
    assert one == 320_592_672 and 150e6 < two - one < 152e6
    assert count(lambda: AutoencoderKLHunyuanVideo15(**REAL_VAE_CONFIG)) == count(AutoencoderKLHunyuanVideo15)


def test_random_module_refuses_persistent_buffers():
    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("table", torch.zeros(3))

    with pytest.raises(ValueError, match="persistent buffers"):
        random_module(WithBuffer, seed=0)
    module = random_module(lambda: torch.nn.Linear(64, 8), seed=0)
    assert module.weight.dtype == torch.bfloat16 and not module.bias.any()


def test_image_to_video_versions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no image encoder"):
        write_real_width_hunyuan(tmp_path, num_layers=1, versions=("480p_i2v",), transformer_config=NARROW)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        write_real_width_hunyuan(tmp_path, num_layers=0, transformer_config=NARROW)

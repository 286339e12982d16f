"""Write a tiny checkpoint in the reference's layout (Tencent's HunyuanVideo-1.5 release), from the tiny diffusers one.

The inverse of :mod:`sage_grpo.models.convert`: the transformer and VAE through the same key tables run backwards
(:func:`~sage_grpo.models.convert_keys.to_reference_keys`) with Tencent's config field names; the text encoder wrapped as a
whole Qwen2.5-VL checkpoint as the hub ships it (``model.*`` keys, a vision-tower tensor and an LM head that the
converter must drop); byT5-small's config and tokenizer; and the Glyph-SDXL-v2 folder, whose ``byt5_model.pt`` (a
tensors-only pickle, as released) holds the encoder under ``module.text_tower.encoder.`` with one embedding row per
added colour and font token.
"""

import json
import shutil
from pathlib import Path
from typing import Dict

import torch
from safetensors.torch import load_file, save_file

from sage_grpo.models import layout
from sage_grpo.models.convert import (GLYPH_COLOR_FILE, GLYPH_FONT_FILE, REFERENCE_BYT5_DIR, REFERENCE_GLYPH_DIR,
                                      REFERENCE_LLM_DIR)
from sage_grpo.models.convert_keys import GLYPH_PREFIX, TRANSFORMER_KEYS, VAE_KEYS, to_reference_keys

GLYPH_COLORS = {"white": 0, "red": 1}
GLYPH_FONTS = {"en-Arial": 0, "zh-Song": 1}  # -> tokens <en-font-0>, <zh-font-1>


def _weights(folder: Path, stem: str) -> Dict[str, torch.Tensor]:
    return load_file(str(folder / f"{stem}.safetensors"))


def _config(folder: Path, name: str = "config.json") -> Dict:
    return json.loads((folder / name).read_text())


def _write(folder: Path, config: Dict, state: Dict[str, torch.Tensor], stem: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / f"{stem}.safetensors"))


def reference_transformer_config(config: Dict, version: str) -> Dict:
    """Tencent's HunyuanVideo_1_5_DiffusionTransformer config for a diffusers transformer config."""
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    return {
        "_class_name": "HunyuanVideo_1_5_DiffusionTransformer",
        "patch_size": [config["patch_size_t"], config["patch_size"], config["patch_size"]],
        "in_channels": config["out_channels"], "concat_condition": True, "out_channels": config["out_channels"],
        "hidden_size": heads * head_dim, "heads_num": heads, "mlp_width_ratio": config["mlp_ratio"],
        "mlp_act_type": "gelu_tanh", "mm_double_blocks_depth": config["num_layers"], "mm_single_blocks_depth": 0,
        "rope_dim_list": list(config["rope_axes_dim"]), "qkv_bias": True, "qk_norm": True, "qk_norm_type": "rms",
        "guidance_embed": False, "use_meanflow": config["use_meanflow"], "text_projection": "single_refiner",
        "use_attention_mask": True, "text_states_dim": config["text_embed_dim"], "rope_theta": config["rope_theta"],
        "glyph_byT5_v2": True, "vision_projection": "linear", "vision_states_dim": config["image_embed_dim"],
        "use_cond_type_embedding": True, "ideal_resolution": version.split("_")[0], "ideal_task": "t2v",
    }


def reference_vae_config(config: Dict) -> Dict:
    return {
        "_class_name": "AutoencoderKLConv3D", "in_channels": config["in_channels"],
        "out_channels": config["out_channels"], "latent_channels": config["latent_channels"],
        "block_out_channels": list(config["block_out_channels"]), "layers_per_block": config["layers_per_block"],
        "ffactor_spatial": config["spatial_compression_ratio"],
        "ffactor_temporal": config["temporal_compression_ratio"],
        "sample_size": 256, "sample_tsize": 64, "scaling_factor": config["scaling_factor"], "shift_factor": None,
        "downsample_match_channel": config["downsample_match_channel"],
        "upsample_match_channel": config["upsample_match_channel"],
    }


def _write_llm(root: Path, out: Path) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2Tokenizer

    text_folder = root / layout.TEXT_ENCODER.subdir
    text_config = _config(text_folder)
    vision_config = dict(depth=1, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=16,
                         fullatt_block_indexes=[0])
    folder = out / REFERENCE_LLM_DIR
    Qwen2_5_VLConfig(text_config=text_config, vision_config=vision_config).save_pretrained(folder)
    state = {f"model.{k}": v for k, v in _weights(text_folder, "model").items()}
    state["visual.patch_embed.proj.weight"] = torch.ones(8, 3, 2, 2, 2)
    state["lm_head.weight"] = torch.ones(text_config["vocab_size"], text_config["hidden_size"])
    save_file(state, str(folder / "model.safetensors"))
    # left padding, as a downloaded tokenizer may have; the converter must write right padding
    Qwen2Tokenizer.from_pretrained(root / layout.TOKENIZER.subdir, padding_side="left").save_pretrained(folder)


def _write_byt5(root: Path, out: Path, seed: int) -> None:
    from transformers import ByT5Tokenizer

    encoder_folder = root / layout.TEXT_ENCODER_2.subdir
    byt5 = out / REFERENCE_BYT5_DIR
    byt5.mkdir(parents=True)
    shutil.copy(encoder_folder / "config.json", byt5 / "config.json")
    ByT5Tokenizer.from_pretrained(root / layout.TOKENIZER_2.subdir).save_pretrained(byt5)
    glyph = out / REFERENCE_GLYPH_DIR
    (glyph / "assets").mkdir(parents=True)
    (glyph / GLYPH_COLOR_FILE).write_text(json.dumps(GLYPH_COLORS))
    (glyph / GLYPH_FONT_FILE).write_text(json.dumps(GLYPH_FONTS))
    state = _weights(encoder_folder, "model")
    embedding = state.get("encoder.embed_tokens.weight", state.get("shared.weight"))
    extra = torch.randn(len(GLYPH_COLORS) + len(GLYPH_FONTS), embedding.shape[1],
                        generator=torch.Generator().manual_seed(seed)).to(embedding.dtype)
    glyph_state = {GLYPH_PREFIX + k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    glyph_state[GLYPH_PREFIX + "embed_tokens.weight"] = torch.cat([embedding, extra])
    (glyph / "checkpoints").mkdir()
    torch.save({"state_dict": glyph_state}, glyph / "checkpoints" / "byt5_model.pt")


def write_reference_layout(root, out, *, seed: int = 0) -> Path:
    """The tiny diffusers checkpoint ``root`` rewritten in the reference's layout under ``out``."""
    root, out = Path(root), Path(out)
    for version in layout.available_transformer_versions(root):
        folder = root / layout.transformer_layout(version).subdir
        state, unmapped = to_reference_keys(_weights(folder, "diffusion_pytorch_model"), TRANSFORMER_KEYS)
        assert not unmapped, unmapped
        _write(out / "transformer" / version, reference_transformer_config(_config(folder), version), state,
               "diffusion_pytorch_model")
    vae_folder = root / layout.VAE.subdir
    state, unmapped = to_reference_keys(_weights(vae_folder, "diffusion_pytorch_model"), VAE_KEYS)
    assert not unmapped, unmapped
    _write(out / "vae", reference_vae_config(_config(vae_folder)), state, "diffusion_pytorch_model")
    _write_llm(root, out)
    _write_byt5(root, out, seed)
    return out

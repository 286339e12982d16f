"""Checkpoint layout, loading, trained-weight loading, the tiny checkpoint and prompt encoding."""

import json
import shutil

import pytest
import torch
from model_fixtures import TINY_TEXT
from safetensors.torch import save_file

from sage_grpo.models import (MissingCheckpointError, PromptEmbeds, PromptEncoder, TextEncoderSettings, check_layout,
                              load_components, load_transformer, load_transformer_weights, required_layouts,
                              write_tiny_hunyuan)
from sage_grpo.cli import verify
from sage_grpo.models.tiny import TINY_TRANSFORMER_CONFIG


# ------------------------------------------------------------------ layout and errors


def test_tiny_checkpoint_has_the_documented_layout(tiny_root):
    check_layout(tiny_root, required_layouts(["480p_t2v"]))
    assert verify.main(["--model_root", str(tiny_root)]) == 0
    for subdir in ("transformer/480p_t2v", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"):
        assert (tiny_root / subdir).is_dir()
    assert json.loads((tiny_root / "scheduler" / "scheduler_config.json").read_text())["shift"] == 5.0


def test_missing_parts_are_listed_in_one_error(tiny_root, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_root, broken)
    (broken / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    (broken / "tokenizer" / "tokenizer.json").unlink()
    shutil.rmtree(broken / "text_encoder_2")
    with pytest.raises(MissingCheckpointError) as info:
        load_components(broken)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    assert err.missing == [
        "vae/diffusion_pytorch_model.safetensors | vae/diffusion_pytorch_model.safetensors.index.json",
        "tokenizer/tokenizer.json | tokenizer/vocab.json + tokenizer/merges.txt",
        "text_encoder_2/  (T5EncoderModel folder)",
    ]
    message = str(err)
    assert "missing 3 required file(s)" in message and "bash download_weights.sh --help" in message
    assert verify.main(["--model_root", str(broken)]) == 1
    # Asking only for what is present works: the transformer alone still loads.
    assert load_components(broken, load_vae=False, load_text_encoders=False).transformer is not None


def test_partial_sharded_download_names_the_missing_shard(tiny_root, tmp_path):
    root = tmp_path / "sharded"
    shutil.copytree(tiny_root / "transformer", root / "transformer")
    folder = root / "transformer" / "480p_t2v"
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    index = {"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors",
                            "b": "diffusion_pytorch_model-00002-of-00002.safetensors"}}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "diffusion_pytorch_model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(MissingCheckpointError) as info:
        load_transformer(root, "480p_t2v", torch.float32)
    assert info.value.missing == ["transformer/480p_t2v/diffusion_pytorch_model-00002-of-00002.safetensors"]


def test_transformer_versions(tiny_root, tmp_path):
    with pytest.raises(MissingCheckpointError, match="transformer version '999p_t2v' is no transformer version"):
        load_transformer(tiny_root, "999p_t2v")
    with pytest.raises(MissingCheckpointError) as info:  # a known version that was not downloaded
        load_transformer(tiny_root, "720p_t2v")
    assert info.value.missing == ["transformer/720p_t2v/  (HunyuanVideo15Transformer3DModel folder)"]
    root = tmp_path / "variants"
    shutil.copytree(tiny_root / "transformer" / "480p_t2v", root / "transformer" / "480p_t2v_distilled")
    model = load_transformer(root, "480p_t2v_distilled", torch.float32)
    assert model.config.num_layers == TINY_TRANSFORMER_CONFIG["num_layers"]


# ------------------------------------------------------------------ loading


def test_load_components(tiny_components):
    c = tiny_components
    assert type(c.transformer).__name__ == "HunyuanVideo15Transformer3DModel"
    assert type(c.vae).__name__ == "AutoencoderKLHunyuanVideo15"
    assert type(c.text_encoder).__name__ == "Qwen2_5_VLTextModel"
    assert type(c.text_encoder_2).__name__ == "T5EncoderModel"
    assert type(c.tokenizer).__name__ == "Qwen2Tokenizer" and c.tokenizer.chat_template
    assert type(c.tokenizer_2).__name__ == "ByT5Tokenizer"
    assert c.transformer.dtype == torch.float32 and c.transformer.config.in_channels == 2 * 4 + 1
    assert all(p.requires_grad for p in c.transformer.parameters())
    for frozen in (c.vae, c.text_encoder, c.text_encoder_2):
        assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    assert c.scheduler_config["shift"] == 5.0 and c.transformer_version == "480p_t2v"


def test_load_components_bf16_and_subsets(tiny_root):
    c = load_components(tiny_root, load_text_encoders=False)
    assert c.transformer.dtype == torch.bfloat16 and c.vae.dtype == torch.bfloat16
    assert c.text_encoder is None and c.tokenizer is None


def test_tiny_checkpoint_is_deterministic_per_seed(tiny_root, tmp_path):
    write_tiny_hunyuan(tmp_path / "same", seed=0)
    write_tiny_hunyuan(tmp_path / "other", seed=1)
    weights = "transformer/480p_t2v/diffusion_pytorch_model.safetensors"
    for part in (weights, "vae/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
                 "tokenizer/tokenizer.json"):
        assert (tmp_path / "same" / part).read_bytes() == (tiny_root / part).read_bytes()
    assert (tmp_path / "other" / weights).read_bytes() != (tiny_root / weights).read_bytes()
    size_mb = sum(f.stat().st_size for f in tiny_root.rglob("*") if f.is_file()) / 2**20
    assert size_mb < 15


# ------------------------------------------------------------------ trained weights


@pytest.fixture
def trained_state(tiny_components):
    """A perturbed copy of the tiny transformer's weights (what a training checkpoint holds)."""
    generator = torch.Generator().manual_seed(3)
    return {k: v + 0.01 * torch.randn(v.shape, generator=generator)
            for k, v in tiny_components.transformer.state_dict().items()}


def test_load_transformer_weights_accepts_every_format(tiny_root, tiny_components, trained_state, tmp_path):
    checkpoint = tmp_path / "checkpoint-7"
    (checkpoint / "transformer").mkdir(parents=True)
    save_file(trained_state, checkpoint / "transformer" / "model.safetensors")
    diffusers_folder = tmp_path / "diffusers_transformer"
    reference = load_transformer(tiny_root, dtype=torch.float32)
    reference.load_state_dict(trained_state)
    reference.save_pretrained(diffusers_folder)
    for source in (checkpoint, checkpoint / "transformer", checkpoint / "transformer" / "model.safetensors",
                   diffusers_folder):
        model = load_transformer(tiny_root, dtype=torch.float32)
        load_transformer_weights(model, source)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in trained_state.items()), source


def test_load_transformer_weights_is_strict(tiny_root, trained_state, tmp_path):
    bad = dict(trained_state)
    bad.pop("proj_out.weight")
    bad["extra.weight"] = torch.zeros(1)
    bad["proj_out.bias"] = torch.zeros(3)
    save_file(bad, tmp_path / "bad.safetensors")
    model = load_transformer(tiny_root, dtype=torch.float32)
    with pytest.raises(ValueError) as info:
        load_transformer_weights(model, tmp_path / "bad.safetensors")
    message = str(info.value)
    assert "missing keys: proj_out.weight" in message and "unexpected keys: extra.weight" in message
    assert "mis-shaped keys: proj_out.bias" in message
    with pytest.raises(FileNotFoundError, match="No transformer weights"):
        load_transformer_weights(model, tmp_path)


# ------------------------------------------------------------------ prompt encoding

PROMPTS = ["A cat walks on the grass", 'A girl holding a paper with words "Hello, world!"']


def test_template_crop_starts_at_the_user_text(tiny_encoder, tiny_components):
    conversation = [{"role": "system", "content": tiny_encoder.system_message}, {"role": "user", "content": PROMPTS[0]}]
    ids = tiny_components.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"]
    kept = tiny_components.tokenizer.decode(ids[tiny_encoder.crop_start:])
    assert kept.startswith(PROMPTS[0]) and tiny_encoder.crop_start > 0


def test_encode_matches_diffusers_pipeline(tiny_encoder, tiny_components):
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline

    c = tiny_components
    pipe = HunyuanVideo15Pipeline(c.text_encoder, c.tokenizer, c.transformer, c.vae, FlowMatchEulerDiscreteScheduler(),
                                  c.text_encoder_2, c.tokenizer_2, ClassifierFreeGuidance(guidance_scale=6.0))
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = TINY_TEXT.max_length, TINY_TEXT.max_length_2
    pipe.prompt_template_encode_start_idx = tiny_encoder.crop_start
    expected = pipe.encode_prompt(PROMPTS, device="cpu", batch_size=2)
    negative = pipe.encode_prompt(None, device="cpu", batch_size=2)
    embeds = tiny_encoder.encode(PROMPTS)
    for ours, theirs in zip(embeds.positive() + embeds.negative(), expected + negative):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=0)
    assert embeds.embeds.shape == (2, 16, TINY_TRANSFORMER_CONFIG["text_embed_dim"])
    assert embeds.embeds_2.shape == (2, 8, TINY_TRANSFORMER_CONFIG["text_embed_2_dim"])
    # byT5 sees only quoted text: zeros for the first prompt and for the empty negative prompt.
    assert embeds.masks_2[0].sum() == 0 and embeds.embeds_2[0].abs().sum() == 0
    assert embeds.masks_2[1].sum() > 0 and embeds.neg_masks_2.sum() == 0


def test_prompt_embeds_select_to_cat(tiny_encoder):
    embeds = tiny_encoder.encode(PROMPTS, negative_prompt="blurry")
    assert len(embeds) == 2
    second = embeds.select([1])
    assert len(second) == 1 and torch.equal(second.embeds[0], embeds.embeds[1])
    assert torch.equal(embeds.select(slice(1, 2)).masks_2, second.masks_2)
    both = PromptEmbeds.cat([embeds.select([1]), embeds.select([0])])
    assert torch.equal(both.embeds, embeds.embeds.flip(0)) and torch.equal(both.neg_embeds, embeds.neg_embeds)
    half = embeds.to("cpu", dtype=torch.bfloat16)
    assert half.embeds.dtype == torch.bfloat16 and half.masks.dtype == embeds.masks.dtype
    assert torch.equal(embeds.neg_embeds[0], embeds.neg_embeds[1])  # one negative, repeated


def test_prompt_cache_in_memory_and_on_disk(tiny_components, tiny_encoder, tmp_path):
    cache_file = tmp_path / "prompts.pt"
    writer = PromptEncoder.from_components(tiny_components, TINY_TEXT, cache_path=cache_file)
    writer.precompute(PROMPTS)
    assert sorted(writer.cached_prompts) == sorted(PROMPTS + [""])
    reader = PromptEncoder.from_components(tiny_components, TINY_TEXT, cache_path=cache_file)
    assert sorted(reader.cached_prompts) == sorted(PROMPTS + [""])
    cached, fresh = reader.encode(PROMPTS[::-1]), tiny_encoder.encode(PROMPTS[::-1])
    assert all(torch.equal(a, b) for a, b in zip(cached.positive() + cached.negative(),
                                                 fresh.positive() + fresh.negative()))
    other_lengths = PromptEncoder.from_components(tiny_components, TextEncoderSettings(max_length=12, max_length_2=8),
                                                  cache_path=cache_file)
    assert other_lengths.cached_prompts == [] and other_lengths.identity != reader.identity
    assert other_lengths.encode(PROMPTS).embeds.shape[1] == 12

"""Joint attention without dense masks (sage_grpo/models/attention.py): the trimmed text and the
key-padding mask give diffusers' own processor's velocity and gradients; no (B, 1, S, S) mask is ever built; the
backend is validated before any model loads."""

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS

from sage_grpo.config import ConfigError
from sage_grpo.config.train import TrainConfig
from sage_grpo.models import attention
from sage_grpo.models.attention import check_attention_backend, install_joint_attention, remove_joint_attention
from sage_grpo.pipeline import cfg_velocity


def _inputs(tiny_components, tiny_encoder, prompts):
    embeds = tiny_encoder.encode(prompts)
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(len(prompts), tiny_components.vae.config.latent_channels, 2, 2, 2, generator=generator)
    timesteps = torch.full((len(prompts),), 700.0)
    return latents, timesteps, embeds


def _velocity_and_grads(transformer, latents, timesteps, embeds):
    transformer.zero_grad(set_to_none=True)
    velocity = cfg_velocity(transformer, latents, timesteps, embeds, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    velocity.square().mean().backward()
    grads = {name: p.grad.clone() for name, p in transformer.named_parameters() if p.grad is not None}
    transformer.zero_grad(set_to_none=True)
    return velocity.detach(), grads


@pytest.mark.parametrize("prompts", [["a red ball"],
                                     ["a red ball", 'a sign "hi" on a wall']])
def test_trimmed_attention_matches_diffusers_processor(tiny_components, tiny_encoder, prompts):
    """One sample (CFG pairs it with the short negative prompt) and two samples of different lengths: velocity and
    every parameter gradient equal diffusers' dense-mask processor over the padded text."""
    transformer = tiny_components.transformer
    inputs = _inputs(tiny_components, tiny_encoder, prompts)
    assert not bool(inputs[2].masks.all())  # the text has padding to trim
    try:
        remove_joint_attention(transformer)
        expected, expected_grads = _velocity_and_grads(transformer, *inputs)
    finally:
        install_joint_attention(transformer)
    velocity, grads = _velocity_and_grads(transformer, *inputs)
    torch.testing.assert_close(velocity, expected, rtol=1e-5, atol=1e-6)
    assert set(grads) == set(expected_grads)
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_no_dense_mask_and_text_trimmed_to_the_longest_valid(tiny_components, tiny_encoder, monkeypatch):
    transformer = tiny_components.transformer
    seen = []
    original = attention.dispatch

    def recording(query, key, value, mask, backend):
        seen.append((query.shape[1], None if mask is None else tuple(mask.shape)))
        return original(query, key, value, mask, backend)

    monkeypatch.setattr(attention, "dispatch", recording)
    latents, timesteps, embeds = _inputs(tiny_components, tiny_encoder, ["a red ball", "a blue cube"])
    with torch.no_grad():  # guidance 1: one call on the positive prompts only
        cfg_velocity(transformer, latents, timesteps, embeds, 1.0, num_image_tokens=TINY_IMAGE_TOKENS)
    config = transformer.config
    image_tokens = 2 // config.patch_size_t * (2 // config.patch_size) ** 2  # latents (T, h, w) = (2, 2, 2)
    valid = (embeds.masks.sum(1) + embeds.masks_2.sum(1)).max().item()
    assert len(seen) == len(transformer.transformer_blocks)
    assert all(length == image_tokens + valid for length, _ in seen)
    assert all(shape == (2, 1, 1, image_tokens + valid) for _, shape in seen)  # a key mask, never (B, 1, S, S)
    padded = embeds.masks.shape[1] + embeds.masks_2.shape[1] + TINY_IMAGE_TOKENS
    assert valid < padded - TINY_IMAGE_TOKENS  # text padding went, as well as the t2v image slots


def test_equal_lengths_need_no_mask(tiny_components, tiny_encoder, monkeypatch):
    transformer = tiny_components.transformer
    masks = []
    original = attention.dispatch
    monkeypatch.setattr(attention, "dispatch",
                        lambda q, k, v, mask, backend: masks.append(mask) or original(q, k, v, mask, backend))
    latents, timesteps, embeds = _inputs(tiny_components, tiny_encoder, ["a red ball", "a red ball"])
    with torch.no_grad():
        cfg_velocity(transformer, latents, timesteps, embeds, 1.0, num_image_tokens=TINY_IMAGE_TOKENS)
    assert masks and all(mask is None for mask in masks)


def test_backend_names_are_checked():
    check_attention_backend("native")
    with pytest.raises(ValueError, match="unknown attention backend 'fast'.*native"):
        check_attention_backend("fast")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="'flash' is not usable here.*'native'"):
            check_attention_backend("flash")


def test_trainer_refuses_a_missing_backend_before_loading(tiny_root, tmp_path, monkeypatch):
    try:
        import flash_attn  # noqa: F401
        pytest.skip("flash-attn is installed here")
    except ImportError:
        pass
    from model_fixtures import tiny_args

    from sage_grpo import trainer as trainer_module

    import sage_grpo.startup.build as startup_build
    from sage_grpo.config import parse_cli

    monkeypatch.setattr(startup_build, "build_models", lambda cfg, kl_mode, placement: pytest.fail("models loaded"))
    cfg = parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--attention_backend", "flash"))
    with pytest.raises(ConfigError, match="--attention_backend: attention backend 'flash' is not usable"):
        trainer_module.GRPOTrainer(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", ["_native_math", "flex"])
def test_backends_agree(tiny_components, tiny_encoder, backend):
    """--attention_backend: another diffusers backend gives native SDPA's velocity (masked batch included)."""
    try:
        check_attention_backend(backend)
    except ValueError as err:
        pytest.skip(str(err))
    transformer = tiny_components.transformer
    inputs = _inputs(tiny_components, tiny_encoder, ["a red ball", 'a sign "hi"'])
    with torch.no_grad():
        expected = cfg_velocity(transformer, *inputs, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
        install_joint_attention(transformer, backend)
        try:
            velocity = cfg_velocity(transformer, *inputs, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
        finally:
            install_joint_attention(transformer, "native")
    assert all(block.attn.processor._attention_backend == "native" for block in transformer.transformer_blocks)
    torch.testing.assert_close(velocity, expected, rtol=1e-5, atol=1e-6)


def test_split_rows_match_the_masked_call_without_a_mask(tiny_components, tiny_encoder, monkeypatch):
    """--mixed_length_attention split: the CFG pair of two prompts (four rows of three valid lengths) runs
    as mask-free calls, one per run of equal length over its own keys; the velocity and every parameter gradient
    equal the masked call's within float order."""
    transformer = tiny_components.transformer
    inputs = _inputs(tiny_components, tiny_encoder, ["a red ball", 'a sign "hi" on a wall'])
    expected, expected_grads = _velocity_and_grads(transformer, *inputs)
    calls = []
    original = attention.dispatch
    monkeypatch.setattr(attention, "dispatch", lambda q, k, v, mask, backend: calls.append(
        (q.shape[:2], k.shape[1], mask)) or original(q, k, v, mask, backend))
    install_joint_attention(transformer, "native", split_rows=True)
    try:
        velocity, grads = _velocity_and_grads(transformer, *inputs)
    finally:
        install_joint_attention(transformer, "native")
    embeds = inputs[2]
    lengths = [int(m.sum() + m2.sum()) for masks in ((embeds.neg_masks, embeds.neg_masks_2),
                                                     (embeds.masks, embeds.masks_2)) for m, m2 in zip(*masks)]
    image_tokens = 8 // transformer.config.patch_size_t // transformer.config.patch_size ** 2  # latents (2, 2, 2)
    runs = attention.row_runs(tuple(lengths))
    assert len(set(lengths)) == 3 and len(runs) == 3  # the two negatives are one run
    per_block = [((end - first, image_tokens + max(lengths)), image_tokens + length, None)
                 for first, end, length in runs]
    assert calls == per_block * len(transformer.transformer_blocks)  # every call mask-free, keys cut to the row's
    torch.testing.assert_close(velocity, expected, rtol=1e-5, atol=1e-6)
    assert set(grads) == set(expected_grads)
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_row_runs_and_the_auto_choice():
    assert attention.row_runs((3, 3, 9, 7, 7)) == [(0, 2, 3), (2, 3, 9), (3, 5, 7)]
    assert attention.row_runs((5,)) == [(0, 1, 5)]
    assert attention.split_rows_of("auto", torch.device("cuda", 0)) and attention.split_rows_of("split", "cpu")
    assert not attention.split_rows_of("auto", "cpu") and not attention.split_rows_of("mask", "cuda")
    with pytest.raises(ValueError, match="unknown mixed-length attention 'varlen'; choose one of auto, mask, split"):
        attention.split_rows_of("varlen", "cpu")


def test_split_calls_match_the_masked_call_in_the_ulysses_processor():
    """joint_attention, the call both processors make: the split rows' calls equal the key-masked call (rows of 3
    and 5 valid text slots after 7 image tokens), and the Ulysses processor (sp 1 emulated: its own __call__) runs the
    split forward as the joint processor does."""
    from benchmarks.sp_emulation import OneRankUlyssesProcessor
    from sage_grpo.models.transformer_forward import SplitRows

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 12, 2, 4, generator=generator) for _ in range(3))
    masked = attention.joint_attention(query, key, value, torch.tensor([[True] * 3 + [False] * 2, [True] * 5]), 7,
                                       "native")
    split = attention.joint_attention(query, key, value, SplitRows((3, 5)), 7, "native")
    torch.testing.assert_close(split, masked, rtol=1e-6, atol=1e-6)
    short = torch.nn.functional.scaled_dot_product_attention(query[:1].transpose(1, 2), key[:1, :10].transpose(1, 2),
                                                             value[:1, :10].transpose(1, 2)).transpose(1, 2)
    assert torch.equal(split[:1], short)  # the short row: its 10 keys, no mask


def test_ulysses_processor_takes_the_split_rows(tiny_components, tiny_encoder):
    from benchmarks.sp_emulation import OneRankUlyssesProcessor

    transformer = tiny_components.transformer
    inputs = _inputs(tiny_components, tiny_encoder, ["a red ball"])
    install_joint_attention(transformer, "native", split_rows=True)
    try:
        with torch.no_grad():
            expected = cfg_velocity(transformer, *inputs, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
            for block in transformer.transformer_blocks:
                block.attn.set_processor(OneRankUlyssesProcessor(1, "native"))
            velocity = cfg_velocity(transformer, *inputs, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    finally:
        install_joint_attention(transformer, "native")
    assert torch.equal(velocity, expected)
    assert not getattr(transformer, "_split_text_rows")  # reinstalled with the default

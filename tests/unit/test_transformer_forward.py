"""The transformer forward without host syncs (sage_grpo/models/transformer_forward.py): bit for bit
diffusers' own forward run with our attention processor and the text trimmed before the blocks (velocity and every
gradient) for text-to-video with padded text of different lengths, equal lengths and image-to-video (against
diffusers' stock processor: tests/unit/test_attention.py); no data-dependent op in a forward on counted embeddings; a
forward that runs on the meta device, where reading any value back is impossible; finite gradients for a row without
a valid text token (NaN in diffusers' forward)."""

import contextlib
from collections import Counter

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT, write_image
from torch.utils._python_dispatch import TorchDispatchMode

from sage_grpo.models.transformer_forward import (TEXT_LAYOUT_KEY, TextLayout, install_joint_forward,
                                                  remove_joint_forward)
from sage_grpo.pipeline import cfg_velocity
from sage_grpo.pipeline.velocity import text_layout

_BLOCK_ARGS = ("hidden_states", "encoder_hidden_states", "temb", "attention_mask", "freqs_cis")


def _trim_before_block(block, args, kwargs):
    """What the blocks received before this forward existed: diffusers' reordered text cut to the longest valid
    length, the key mask dropped when no padding is left (read back from the device, once per block)."""
    values = dict(zip(_BLOCK_ARGS, args), **kwargs)
    mask = values["attention_mask"].bool()
    counts = mask.sum(dim=1)
    length, shortest = int(counts.max()), int(counts.min())
    values["encoder_hidden_states"] = values["encoder_hidden_states"][:, :length]
    values["attention_mask"] = None if shortest == length else mask[:, :length]
    return (), values


@contextlib.contextmanager
def diffusers_forward(transformer):
    """diffusers' ``forward`` (our attention processors stay) with the text trimmed before every block."""
    remove_joint_forward(transformer)
    handles = [block.register_forward_pre_hook(_trim_before_block, with_kwargs=True)
               for block in transformer.transformer_blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        install_joint_forward(transformer)


def _velocity_and_grads(transformer, latents, embeds, num_image_tokens):
    transformer.zero_grad(set_to_none=True)
    timesteps = torch.full((latents.shape[0],), 700.0)
    velocity = cfg_velocity(transformer, latents, timesteps, embeds, 6.0, num_image_tokens=num_image_tokens)
    velocity.square().mean().backward()
    grads = {name: p.grad.clone() for name, p in transformer.named_parameters() if p.grad is not None}
    transformer.zero_grad(set_to_none=True)
    return velocity.detach(), grads


def _assert_bit_identical(transformer, latents, embeds, num_image_tokens):
    with diffusers_forward(transformer):
        expected, expected_grads = _velocity_and_grads(transformer, latents, embeds, num_image_tokens)
    velocity, grads = _velocity_and_grads(transformer, latents, embeds, num_image_tokens)
    assert torch.equal(velocity, expected)
    assert set(grads) == set(expected_grads) and len(grads) > 10
    assert all(torch.equal(grads[name], expected_grads[name]) for name in grads)


def _latents(batch, shape=(2, 2, 2)):
    return torch.randn(batch, 4, *shape, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("prompts", [["a red ball", 'a sign "hi" on a wall'],  # padded, lengths differ
                                     ["a red ball", "a red ball"]])  # CFG rows still differ from the positives
@pytest.mark.parametrize("checkpointing", [False, True])
def test_t2v_matches_diffusers_forward_bit_for_bit(tiny_components, tiny_encoder, prompts, checkpointing):
    transformer = tiny_components.transformer
    embeds = tiny_encoder.encode(prompts)
    assert not bool(embeds.masks.all())  # the text has padding
    if checkpointing:
        transformer.enable_gradient_checkpointing()
    try:
        _assert_bit_identical(transformer, _latents(len(prompts)), embeds, TINY_IMAGE_TOKENS)
    finally:
        transformer.disable_gradient_checkpointing()


def test_a_row_without_valid_text_gives_finite_gradients(tiny_components, tiny_encoder):
    """Row 1's MLLM text masked out entirely (both CFG branches): diffusers' token refiner pools it 0/0, so every
    refiner gradient is NaN although the row's text is discarded; the guarded forward gives diffusers' velocity and
    finite gradients."""
    transformer = tiny_components.transformer
    embeds = tiny_encoder.encode(["a red ball", 'a sign "hi" on a wall'])
    embeds.masks[1], embeds.neg_masks[1], embeds.valid_tokens = 0, 0, None
    with diffusers_forward(transformer):
        expected, expected_grads = _velocity_and_grads(transformer, _latents(2), embeds, TINY_IMAGE_TOKENS)
    nan = sorted(name for name, grad in expected_grads.items() if not torch.isfinite(grad).all())
    assert nan and all(name.startswith("context_embedder.") for name in nan)  # the refiner's, in diffusers
    velocity, grads = _velocity_and_grads(transformer, _latents(2), embeds, TINY_IMAGE_TOKENS)
    assert torch.isfinite(expected).all() and torch.equal(velocity, expected)
    assert set(grads) == set(expected_grads) and all(torch.isfinite(grad).all() for grad in grads.values())
    assert all(torch.equal(grads[name], expected_grads[name]) for name in set(grads) - set(nan))


def test_uncounted_embeddings_give_the_same_velocity(tiny_components, tiny_encoder):
    """Embeddings built without counts (``valid_tokens`` None): the forward counts the layout itself."""
    embeds = tiny_encoder.encode(["a red ball", 'a sign "hi" on a wall'])
    uncounted = embeds.select([0, 1])
    uncounted.valid_tokens = None
    latents, timesteps = _latents(2), torch.full((2,), 500.0)
    with torch.no_grad():
        counted = cfg_velocity(tiny_components.transformer, latents, timesteps, embeds, 6.0,
                               num_image_tokens=TINY_IMAGE_TOKENS)
        counted_here = cfg_velocity(tiny_components.transformer, latents, timesteps, uncounted, 6.0,
                                    num_image_tokens=TINY_IMAGE_TOKENS)
    assert torch.equal(counted, counted_here)


def test_i2v_matches_diffusers_forward_bit_for_bit(tiny_i2v_root, tmp_path):
    from sage_grpo.models import PromptEncoder
    from sage_grpo.models.image_condition import ImageConditionEncoder
    from sage_grpo.models.loading import load_components

    components = load_components(tiny_i2v_root, "480p_i2v", dtype=torch.float32)
    images = [str(write_image(tmp_path / f"{i}.png", 20, 30, seed=i)) for i in range(2)]
    condition = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae)
    embeds = PromptEncoder.from_components(components, TINY_TEXT).encode(["a cat", 'a sign "hi" on a wall'])
    embeds = embeds.with_image(condition.encode(images, 16, 24))
    layout = text_layout(embeds, True, TINY_IMAGE_TOKENS)
    assert layout.has_image and layout.needs_mask
    _assert_bit_identical(components.transformer, _latents(2, (2, 2, 3)), embeds, TINY_IMAGE_TOKENS)


class _DataDependentOps(TorchDispatchMode):
    """Counts the ops that read a value back to the host: ``nonzero``, ``item``/``_local_scalar_dense`` and indexing
    with a boolean mask (on the CPU ``aten.index`` runs its ``nonzero`` inside the kernel, unseen by the mode)."""

    NAMES = ("aten.nonzero", "aten._local_scalar_dense", "aten.item")

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in self.NAMES:
            self.counts[name] += 1
        if name == "aten.index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.counts["boolean index"] += 1
        return func(*args, **(kwargs or {}))


def _count_second_forward(transformer, embeds):
    latents, timesteps = _latents(len(embeds)), torch.full((len(embeds),), 300.0)
    with torch.no_grad():
        cfg_velocity(transformer, latents, timesteps, embeds, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
        with _DataDependentOps() as counter:
            cfg_velocity(transformer, latents, timesteps, embeds, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    return counter.counts


def test_no_host_sync_in_a_forward(tiny_components, tiny_encoder):
    transformer = tiny_components.transformer
    embeds = tiny_encoder.encode(["a red ball", 'a sign "hi" on a wall'])
    with diffusers_forward(transformer):
        before = _count_second_forward(transformer, embeds)
    # 4 rows (2 samples x CFG) x 12 boolean-mask indexings; t2v read back once (the test's trim hook adds 2 per block)
    assert before["boolean index"] == 48 and before["aten._local_scalar_dense"] >= 1
    assert sum(_count_second_forward(transformer, embeds).values()) == 0


def test_the_forward_runs_on_the_meta_device(tiny_components):
    """With the layout given, no value is ever read: the forward runs on meta tensors (what a memory plan under
    fake tensors needs), where diffusers' forward cannot."""
    from diffusers import HunyuanVideo15Transformer3DModel

    config = {k: v for k, v in tiny_components.transformer.config.items() if not k.startswith("_")}
    with torch.device("meta"):
        transformer = HunyuanVideo15Transformer3DModel.from_config(config)
        inputs = dict(hidden_states=torch.zeros(2, 9, 2, 2, 2), timestep=torch.full((2,), 500.0),
                      encoder_hidden_states=torch.zeros(2, 16, 16), encoder_attention_mask=torch.ones(2, 16),
                      encoder_hidden_states_2=torch.zeros(2, 8, 32), encoder_attention_mask_2=torch.ones(2, 8),
                      image_embeds=torch.zeros(2, TINY_IMAGE_TOKENS, 12), return_dict=False)
    with pytest.raises((NotImplementedError, RuntimeError)):
        transformer(**inputs)
    install_joint_forward(transformer)
    layout = TextLayout(has_image=False, valid_lengths=(20, 24))
    velocity = transformer(**inputs, attention_kwargs={TEXT_LAYOUT_KEY: layout})[0]
    assert velocity.device.type == "meta" and tuple(velocity.shape) == (2, 4, 2, 2, 2)


def test_layout_counts_match_the_masks(tiny_encoder):
    embeds = tiny_encoder.encode(["a red ball", 'a sign "hi" on a wall'])
    expected = torch.stack([embeds.masks.sum(1) + embeds.masks_2.sum(1),
                            embeds.neg_masks.sum(1) + embeds.neg_masks_2.sum(1)], dim=1)
    rows = [tuple(row) for row in expected.tolist()]
    assert embeds.valid_tokens == tuple(rows) and rows[0] != rows[1] and all(type(n) is int for n in rows[0])
    assert embeds.select([1]).valid_tokens == (rows[1],) == embeds.select(torch.tensor([1])).valid_tokens
    assert type(embeds).cat([embeds, embeds.select(slice(0, 1))]).valid_tokens == (rows[0], rows[1], rows[0])
    assert embeds.to("cpu").valid_tokens == embeds.valid_tokens
    counted = TextLayout.count(torch.zeros(2, 4, 12), embeds.masks, embeds.masks_2)
    assert counted == TextLayout(False, tuple(expected[:, 0].tolist()))
    assert TextLayout.count(torch.ones(2, 4, 12), embeds.masks, embeds.masks_2).valid_lengths == \
        tuple((expected[:, 0] + 4).tolist())

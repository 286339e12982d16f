"""Memory placement: the ``auto`` rules of ``sage_grpo.plan.memory.resolve_placement``, tiled decoding, text
encoders that visit the compute device only to encode, and reference means batched by
``--mini_batch_size_per_update`` (equal to one transition per forward); the process's device, decided once."""

from dataclasses import replace

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS

from sage_grpo.config.train import TrainConfig
from sage_grpo.models import PromptEncoder
from sage_grpo.models.vae import decode_latents
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.models.placement import VAE_TILING_PIXELS, Placement
from sage_grpo.plan.memory import resolve_placement


def _placement(sharded=True, **flags) -> Placement:
    """The placement without a GPU budget (a CPU device); on CUDA the memory plan decides ``auto`` (test_plan.py)."""
    return resolve_placement(TrainConfig.of(**flags), sharded=sharded, device_type="cpu")


def test_auto_reduces_per_backward_only_for_a_sharded_full_fine_tune():
    assert _placement(sharded=True).reduce_per_backward
    assert not _placement(sharded=False).reduce_per_backward
    assert not _placement(sharded=True, use_lora=True).reduce_per_backward  # adapter gradients are small
    assert not _placement(sharded=True, gradient_reduction="per_update").reduce_per_backward
    assert _placement(sharded=False, gradient_reduction="per_backward").reduce_per_backward


def test_reference_offload_rules():
    # without a budget the reference stays where the model is; --reference_placement cpu offloads it (FSDP's CPU
    # offload, which the CPU tests exercise)
    assert not _placement(sharded=True, reference_mode_offload=True).reference_on_cpu
    assert not _placement(sharded=False, reference_mode_offload=True).reference_on_cpu
    assert _placement(sharded=True, reference_placement="cpu").reference_on_cpu
    assert not _placement(sharded=False, reference_mode_offload=True, reference_placement="device").reference_on_cpu


def test_vae_tiling_by_size():
    auto = _placement()
    assert auto.tile(81, 352, 624) and auto.tile(121, 480, 864)
    assert not auto.tile(5, 16, 16) and not auto.tile(33, 480, 854)
    assert 33 * 480 * 854 == VAE_TILING_PIXELS
    assert _placement(vae_tiling="true").tile(5, 16, 16)
    assert not _placement(vae_tiling="false").tile(121, 480, 864)


def test_decode_tiling_is_applied_and_restored(tiny_components):
    vae = tiny_components.vae
    latents = torch.randn(1, vae.config.latent_channels, 2, 6, 6, generator=torch.Generator().manual_seed(0))
    calls = []
    original = vae.tiled_decode

    def spy(*args, **kwargs):
        calls.append(True)
        return original(*args, **kwargs)

    vae.tiled_decode = spy
    saved = {name: getattr(vae, name) for name in ("tile_sample_min_height", "tile_sample_min_width",
                                                   "tile_latent_min_height", "tile_latent_min_width")}
    ratio = vae.config.spatial_compression_ratio
    vae.tile_sample_min_height = vae.tile_sample_min_width = 4 * ratio  # 2 x 2 tiles of 4 x 4 latents (stride 3)
    vae.tile_latent_min_height = vae.tile_latent_min_width = 4
    try:
        plain = decode_latents(vae, latents, tiling=False)
        assert not calls and vae.use_tiling is False
        tiled = decode_latents(vae, latents, tiling=True)
        assert calls and vae.use_tiling is False  # the VAE's own setting is back
    finally:
        del vae.tiled_decode
        for name, value in saved.items():
            setattr(vae, name, value)
    assert tiled.shape == plain.shape and not torch.equal(tiled, plain)  # the tiles were blended


def test_offloaded_encoders_visit_the_compute_device_only_to_encode(tiny_components, tiny_encoder):
    """``cpu:0`` stands in for a GPU: the encoders move there for an encode of new prompts and back afterwards, and
    the embeddings are those of encoders that never move; cached prompts do not move the encoders at all."""
    from model_fixtures import TINY_TEXT

    moves = []
    encoder = PromptEncoder.from_components(tiny_components, TINY_TEXT, cache=True, compute_device="cpu:0")
    original_to = tiny_components.text_encoder.to

    def recording_to(*args, **kwargs):
        moves.append(str(args[0]))
        return original_to(*args, **kwargs)

    tiny_components.text_encoder.to = recording_to
    try:
        prompts = ["a red ball", 'a sign saying "hi"']
        embeds = encoder.encode(prompts)
        assert moves == ["cpu:0", "cpu", "cpu:0", "cpu"]  # the prompts, then the negative prompt
        encoder.encode(prompts)
        assert len(moves) == 4  # all cached
    finally:
        del tiny_components.text_encoder.to
    expected = tiny_encoder.encode(prompts)
    for name in ("embeds", "masks", "embeds_2", "masks_2"):
        assert torch.equal(getattr(embeds, name), getattr(expected, name))
    assert tiny_encoder.device == torch.device("cpu")


@pytest.mark.parametrize("micro", [3, 4])
def test_reference_means_batched_equal_one_transition_per_forward(tiny_components, tiny_encoder, micro):
    """--mini_batch_size_per_update transitions per reference forward (a forward mixing samples and steps) give the
    means of one transition per forward; at 1 they are exactly the replay's."""
    transformer = tiny_components.transformer
    sampler = Sampler.build("sage_grpo", 0.5, 3, 5.0, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    embeds = tiny_encoder.encode(["a red ball", "a blue cube"])
    latents = torch.randn(2, 4, tiny_components.vae.config.latent_channels, 2, 2, 2,
                          generator=torch.Generator().manual_seed(1))
    cpu = torch.device("cpu")
    one = sampler.transition_means(transformer, latents, embeds, cpu)
    batched = replace(sampler, micro_batch_size=micro).transition_means(transformer, latents, embeds, cpu)
    assert one.shape == (2, 3, *latents.shape[2:])
    expected = torch.stack([torch.cat([sampler.replay(transformer, latents[i:i + 1, k], latents[i:i + 1, k + 1], k,
                                                      embeds.select([i])).mean for k in range(3)]) for i in range(2)])
    assert torch.equal(one, expected)
    torch.testing.assert_close(batched, one, rtol=1e-4, atol=1e-5)  # observed <= 2e-6: summation order


def test_the_device_is_decided_once_and_a_cuda_device_has_its_index(monkeypatch, tiny_root):
    """--device cuda under torchrun is this process's cuda:LOCAL_RANK, for the models and the parallel layout alike
    (the NCCL barrier needs the index); checked on the CPU with a faked CUDA."""
    from sage_grpo.models.bundle import resolve_device
    from sage_grpo.startup.processes import start_processes

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine: no set_device(3) below
    assert resolve_device(TrainConfig.of(device="cuda")) == torch.device("cuda", 3)
    assert resolve_device(TrainConfig.of(device="cuda:1")) == torch.device("cuda", 1)
    assert resolve_device(TrainConfig.of(device="cpu")) == torch.device("cpu")
    assert resolve_device(TrainConfig.of()) == torch.device("cpu")
    cfg = TrainConfig.of(device="cuda", pretrained_model_root=str(tiny_root), sp_size=1, num_generations=2)
    dims, _, _ = start_processes(cfg, resolve_device(cfg))
    assert dims.device == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(TrainConfig.of()) == torch.device("cuda", 3)

"""The step-distilled ``480p_i2v_step_distilled``: a mean-flow transformer (``use_meanflow``) that takes a second
timestep ``timestep_r`` at every step. Rollouts, replay and generate.py pass the schedule's next point
1000·σ_{k+1} (0 at the last step), as diffusers' ``HunyuanVideo15ImageToVideoPipeline`` does, checked against that
pipeline on a tiny mean-flow transformer; the drift proxy's denoiser passes r = t."""

import pytest
import torch
from i2v_support import render_beside_diffusers_i2v
from model_fixtures import TINY_SEED, TINY_TEXT, write_image

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.models import PromptEncoder, write_tiny_hunyuan
from sage_grpo.models.image_condition import ImageConditionEncoder
from sage_grpo.models.loading import load_components
from sage_grpo.models.variants import read_variant_sampling
from sage_grpo.pipeline import VideoSize, cfg_velocity, replay_step, rollout
from sage_grpo.pipeline.drift import conditional_velocity
from sage_grpo.pipeline.sampler import Sampler

VERSION = "480p_i2v_step_distilled"
NUM_STEPS = 3
SMALL_VIDEO = dict(num_frames=5, height=16, width=24)  # latents (4, 2, 2, 3)


@pytest.fixture(scope="module")
def meanflow_root(tmp_path_factory):
    return write_tiny_hunyuan(tmp_path_factory.mktemp("tiny_meanflow"), seed=TINY_SEED, versions=(VERSION,))


@pytest.fixture(scope="module")
def components(meanflow_root):
    return load_components(meanflow_root, VERSION, dtype=torch.float32)


@pytest.fixture(scope="module")
def embeds(components, tmp_path_factory):
    images = [write_image(tmp_path_factory.mktemp("images") / f"{i}.png", 30, 50, seed=i) for i in (1, 2)]
    condition = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae)
    encoder = PromptEncoder.from_components(components, TINY_TEXT)
    return encoder.encode(["A cat walks on the grass", "A dog runs"]).with_image(
        condition.encode([str(p) for p in images], SMALL_VIDEO["height"], SMALL_VIDEO["width"]))


def _record_timestep_r(transformer, calls):
    return transformer.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs.get("timestep_r")), with_kwargs=True)


def test_the_tiny_step_distilled_version_is_a_meanflow_transformer(meanflow_root, components):
    assert components.transformer.config.use_meanflow and components.transformer.config.task_type == "i2v"
    assert components.transformer.time_embed.timestep_embedder_r is not None
    variant = read_variant_sampling(meanflow_root, VERSION)  # diffusers' conversion configs: CFG 1.0, shift 7.0
    assert (variant.guidance_scale, variant.flow_shift) == (1.0, 7.0)


def test_a_meanflow_call_without_its_second_timestep_is_refused(components, embeds):
    latents = torch.randn(2, 4, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="mean-flow transformer .* without its second timestep timesteps_r"):
        cfg_velocity(components.transformer, latents, torch.full((2,), 900.0), embeds)
    with torch.no_grad():
        near = cfg_velocity(components.transformer, latents, torch.full((2,), 900.0), embeds,
                            timesteps_r=torch.full((2,), 800.0))
        far = cfg_velocity(components.transformer, latents, torch.full((2,), 900.0), embeds,
                           timesteps_r=torch.full((2,), 0.0))
    assert not torch.allclose(near, far)  # the second timestep reaches the model


def test_rollout_and_replay_pass_the_next_timestep_and_agree(components, embeds):
    sampler = Sampler.build("sage_grpo", 0.5, NUM_STEPS, 7.0, 6.0, micro_batch_size=2)
    expected = [float(1000 * s) for s in sampler.sigmas[1:]]
    calls = []
    handle = _record_timestep_r(components.transformer, calls)
    try:
        out = rollout(sampler, components.transformer, components.vae, embeds, [21, 22], VideoSize(**SMALL_VIDEO),
                      decode=False)
        # CFG: one call on [negative; positive] per step, both rows at 1000·σ_{k+1}; 0 at the last step
        assert [c.tolist() for c in calls] == [[r] * 4 for r in expected] and expected[-1] == 0.0
        calls.clear()
        for k in range(NUM_STEPS):
            replayed = replay_step(sampler, components.transformer, out.latents[:, k], out.latents[:, k + 1],
                                   torch.tensor([k, k]), embeds)
            assert torch.equal(replayed.log_prob, out.log_probs[:, k]), k
        assert [c.tolist() for c in calls] == [[r] * 4 for r in expected]
        calls.clear()
        with torch.no_grad():  # the drift proxy's denoiser: the instantaneous velocity, r = t
            conditional_velocity(components.transformer, embeds, sampler)(out.latents[:, -1], 0.25)
        assert calls[0].tolist() == [250.0, 250.0]
    finally:
        handle.remove()


def test_generate_samples_the_meanflow_model_as_diffusers_i2v_pipeline(meanflow_root, tmp_path, monkeypatch):
    image_file = write_image(tmp_path / "wide.png", 30, 50, seed=3)
    config = GenerateConfig(model_path=str(meanflow_root), prompt="A red ball rolls", seed=5, dtype="fp32",
                            device="cpu", offloading=False, video_length=5, num_inference_steps=NUM_STEPS,
                            text_max_length=TINY_TEXT.max_length, byt5_max_length=TINY_TEXT.max_length_2,
                            image_path=str(image_file), fixed_size="48x80", model_version=VERSION)
    _, ours, latents, plan = render_beside_diffusers_i2v(config, monkeypatch)
    assert (plan.guidance_scale, plan.flow_shift) == (1.0, 7.0)  # the variant's own configs
    torch.testing.assert_close(latents, ours, rtol=0, atol=1e-5)

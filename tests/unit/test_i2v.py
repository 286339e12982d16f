"""Image-to-video on the tiny ``480p_i2v`` checkpoint: the layout and loader, the image condition (VAE latent of the
reference frame + task mask, SigLIP states), exact rollout/replay log-probs for every SDE type, ODE parity with
diffusers' ``HunyuanVideo15ImageToVideoPipeline`` and the closest aspect-ratio bucket."""

import shutil

import pytest
import torch
from model_fixtures import TINY_TEXT, write_image

from sage_grpo import sde
from sage_grpo.models import PromptEncoder
from sage_grpo.models.image_condition import ImageCondition, ImageConditionEncoder, closest_bucket
from sage_grpo.models.layout import MissingCheckpointError, check_model_root, required_layouts, version_task
from sage_grpo.models.loading import load_components
from sage_grpo.pipeline import VideoSize, replay_step, rollout
from sage_grpo.pipeline.sampler import Sampler

PROMPTS = ["A cat walks on the grass", "A dog runs on a beach"]
SEEDS = [21, 22]
NUM_STEPS = 3
VIDEO = dict(num_frames=5, height=48, width=80)  # latents (4, 2, 6, 10) with the tiny VAE (temporal 4, spatial 8)
SMALL_VIDEO = dict(num_frames=5, height=16, width=24)  # latents (4, 2, 2, 3): the replay tests


@pytest.fixture(scope="module")
def components(tiny_i2v_root):
    return load_components(tiny_i2v_root, "480p_i2v", dtype=torch.float32)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    return [write_image(folder / "wide.png", 30, 50, seed=1), write_image(folder / "tall.png", 64, 40, seed=2)]


def _embeds(components, images, video):
    encoder = PromptEncoder.from_components(components, TINY_TEXT)
    condition = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae)
    return encoder.encode(PROMPTS).with_image(condition.encode([str(p) for p in images], video["height"],
                                                               video["width"]))


@pytest.fixture(scope="module")
def i2v_embeds(components, images):
    return _embeds(components, images, VIDEO)


@pytest.fixture(scope="module")
def small_embeds(components, images):
    return _embeds(components, images, SMALL_VIDEO)


def test_i2v_layout_and_loader(tiny_i2v_root, components, tmp_path):
    assert version_task("480p_i2v") == "i2v" and version_task("720p_i2v_distilled") == "i2v"
    assert version_task("480p_t2v") == "t2v"
    names = [spec.name for spec in required_layouts(("480p_i2v",))]
    assert "image_encoder" in names and "feature_extractor" in names
    assert "image_encoder" not in [spec.name for spec in required_layouts(("480p_t2v",))]
    assert type(components.image_encoder).__name__ == "SiglipVisionModel"
    assert components.image_encoder.config.hidden_size == components.transformer.config.image_embed_dim
    assert not any(p.requires_grad for p in components.image_encoder.parameters())
    assert components.transformer.config.task_type == "i2v"
    # a root without the image encoder is refused before any model loads, naming the folder
    broken = tmp_path / "root"
    shutil.copytree(tiny_i2v_root, broken)
    shutil.rmtree(broken / "image_encoder")
    with pytest.raises(MissingCheckpointError, match="image_encoder/"):
        check_model_root(broken, "480p_i2v")


def test_image_condition_channels_and_embeds(components, images, i2v_embeds):
    image = i2v_embeds.image
    assert image.latents.shape == (2, 4, 1, 6, 10) and image.embeds.shape == (2, 4, 12)
    assert not torch.equal(image.latents[0], image.latents[1]) and image.embeds.abs().sum() > 0
    channels = image.condition_channels(num_frames=2, dtype=torch.float32)  # (B, C+1, T, h, w)
    assert torch.equal(channels[:, :4, 0], image.latents[:, :, 0]) and (channels[:, :4, 1:] == 0).all()
    assert (channels[:, 4, 0] == 1).all() and (channels[:, 4, 1:] == 0).all()
    # the VAE latent is the posterior's mode of the centre-cropped frame, scaled
    encoder = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae)
    from PIL import Image
    pixels = encoder.video_processor.preprocess(
        encoder.video_processor.resize(Image.open(images[0]).convert("RGB"), 48, 80, resize_mode="crop"), 48, 80)
    expected = components.vae.encode(pixels.unsqueeze(2)).latent_dist.mode() * components.vae.config.scaling_factor
    torch.testing.assert_close(image.latents[:1], expected, rtol=0, atol=0)
    # select/to keep rows together with the prompts
    picked = i2v_embeds.select([1])
    assert torch.equal(picked.image.embeds[0], image.embeds[1]) and torch.equal(picked.embeds[0], i2v_embeds.embeds[1])
    assert isinstance(i2v_embeds.to("cpu").image, ImageCondition)
    with pytest.raises(ValueError, match="one transformer call"):
        type(i2v_embeds).cat([i2v_embeds, i2v_embeds.with_image(None)])


def test_image_cache_is_bounded_and_least_recently_used(components, images, monkeypatch):
    """The condition cache keeps at most its byte budget, drops the least recently used, and a dropped condition
    re-encodes to the same tensors; repeated paths in one call are encoded once."""
    import sage_grpo.models.image_condition as module

    calls = []
    real_load = module.load_image
    monkeypatch.setattr(module, "load_image", lambda path: calls.append(str(path)) or real_load(path))
    wide, tall = (str(p) for p in images)
    unbounded = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae)
    first = unbounded.encode([wide, wide, tall], 16, 24)
    assert calls == [wide, tall] and torch.equal(first.latents[0], first.latents[1])
    one = unbounded.cache_bytes // 2  # both conditions have the same size
    assert one > 0 and unbounded.cache_bytes == 2 * one

    calls.clear()
    bounded = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae,
                                    max_cache_bytes=one)  # room for one condition
    bounded.encode([wide], 16, 24)
    bounded.encode([tall], 16, 24)  # drops wide
    assert bounded.cache_bytes == one
    again = bounded.encode([tall, wide], 16, 24)  # tall from the cache, wide re-encoded (drops tall)
    assert calls == [wide, tall, wide]
    assert torch.equal(again.latents, first.latents[[2, 0]]) and torch.equal(again.embeds, first.embeds[[2, 0]])
    bounded.encode([wide], 16, 24)
    assert calls == [wide, tall, wide]  # the most recent one stayed

    calls.clear()
    uncached = ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae,
                                     max_cache_bytes=0)
    uncached.encode([wide], 16, 24)
    uncached.encode([wide], 16, 24)
    assert calls == [wide, wide] and uncached.cache_bytes == 0


def test_the_image_changes_the_velocity(components, i2v_embeds):
    from sage_grpo.pipeline import cfg_velocity

    latents = torch.randn(2, 4, 2, 6, 10, generator=torch.Generator().manual_seed(0))
    timesteps = torch.full((2,), 900.0)
    with torch.no_grad():
        with_image = cfg_velocity(components.transformer, latents, timesteps, i2v_embeds)
        swapped = cfg_velocity(components.transformer, latents, timesteps, i2v_embeds.with_image(
            ImageCondition(i2v_embeds.image.latents.flip(0), i2v_embeds.image.embeds.flip(0))))
        text_only = cfg_velocity(components.transformer, latents, timesteps, i2v_embeds.with_image(None),
                                 num_image_tokens=4)
    assert not torch.allclose(with_image, swapped) and not torch.allclose(with_image, text_only)


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_replay_reproduces_i2v_rollout_log_probs_exactly(components, small_embeds, sde_type):
    sampler = Sampler.build(sde_type, 0.5, NUM_STEPS, 5.0, 6.0, micro_batch_size=2)
    out = rollout(sampler, components.transformer, components.vae, small_embeds, SEEDS, VideoSize(**SMALL_VIDEO),
                  decode=False)
    assert torch.isfinite(out.log_probs).all()
    for k in range(NUM_STEPS):
        replayed = replay_step(sampler, components.transformer, out.latents[:, k], out.latents[:, k + 1],
                               torch.tensor([k, k]), small_embeds)
        assert torch.equal(replayed.log_prob, out.log_probs[:, k]), (sde_type, k)
        assert replayed.log_prob.requires_grad


def test_ode_rollout_matches_diffusers_i2v_pipeline(components, images, i2v_embeds):
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15ImageToVideoPipeline
    from PIL import Image

    c = components
    pipe = HunyuanVideo15ImageToVideoPipeline(
        c.text_encoder, c.tokenizer, c.transformer, c.vae, FlowMatchEulerDiscreteScheduler.from_config(
            c.scheduler_config), c.text_encoder_2, c.tokenizer_2, ClassifierFreeGuidance(guidance_scale=6.0),
        c.image_encoder, c.feature_extractor)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = TINY_TEXT.max_length, TINY_TEXT.max_length_2
    pipe.prompt_template_encode_start_idx = PromptEncoder.from_components(c, TINY_TEXT).crop_start
    image = Image.open(images[0]).convert("RGB")
    # diffusers picks the bucket of the transformer's target_size closest to the image's aspect ratio
    assert closest_bucket((image.height, image.width), c.transformer.config.target_size, 8) == (48, 80)
    ours = rollout(Sampler.euler(NUM_STEPS, 5.0, 6.0), c.transformer, c.vae, i2v_embeds.select([0]), SEEDS[:1],
                   VideoSize(**VIDEO), deterministic=True, decode=False)
    latents = pipe(image=image, prompt=PROMPTS[0], negative_prompt=None, num_frames=VIDEO["num_frames"],
                   num_inference_steps=NUM_STEPS, latents=ours.latents[:, 0].clone(), output_type="latent").frames
    torch.testing.assert_close(pipe.scheduler.sigmas, ours.sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(latents, ours.final_latents, rtol=0, atol=1e-5)


def test_closest_bucket():
    assert closest_bucket((720, 1280), 480) == (352, 624)  # 16:9 at base 480: the reference rollout size
    assert closest_bucket((1280, 720), 480) == (624, 352)
    assert closest_bucket((512, 512), 480) == (480, 480)
    height, width = closest_bucket((300, 400), 640)
    assert height % 16 == 0 and width % 16 == 0 and abs(height / width - 0.75) < 0.05

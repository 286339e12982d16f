"""generate.py with a reference image: ``--image_path`` and the CSV column, the i2v version and bucket, errors before
any model loads, ODE parity with diffusers' ``HunyuanVideo15ImageToVideoPipeline`` and an mp4 end to end."""

import pytest
import torch
import generate

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.pipeline.generation import VideoGenerator, plan_generation

from i2v_support import render_beside_diffusers_i2v
from model_fixtures import TINY_TEXT, write_image


NUM_STEPS = 3


def _config(root, **overrides):
    values = dict(model_path=str(root), prompt="A red ball rolls", seed=5, dtype="fp32", device="cpu",
                  offloading=False, video_length=5, num_inference_steps=NUM_STEPS,
                  text_max_length=TINY_TEXT.max_length, byt5_max_length=TINY_TEXT.max_length_2)
    values.update(overrides)
    return GenerateConfig(**values)


def test_image_path_plans_image_to_video(tiny_i2v_root, tmp_path, monkeypatch):
    image = write_image(tmp_path / "wide.png", 300, 500)
    plan = plan_generation(_config(tiny_i2v_root, image_path=str(image)))
    assert plan.transformer_version == "480p_i2v" and plan.items[0].image_path == str(image)
    assert plan.items[0].size == (496, 824)  # the 640-base bucket closest to 3:5 (in steps of the tiny VAE's 8 pixels)
    assert (plan.guidance_scale, plan.flow_shift) == (6.0, 5.0)
    assert plan_generation(_config(tiny_i2v_root, image_path=str(image), fixed_size="48x80")).items[0].size == (48, 80)
    assert plan_generation(_config(tiny_i2v_root, image_path="none", model_version="480p_i2v")).items[0].image_path \
        == ""
    # a CSV column (relative to the CSV), --image_path the default for rows without one
    (tmp_path / "data").mkdir()
    write_image(tmp_path / "data" / "own.png", 40, 40)
    csv = tmp_path / "data" / "p.csv"
    csv.write_text("prompt,seed,ref_image_path\nfirst,1,own.png\nsecond,2,\n")
    items = plan_generation(_config(tiny_i2v_root, valid_video_csv=[str(csv)], image_path=str(image))).items
    assert [i.image_path for i in items] == [str(tmp_path / "data" / "own.png"), str(image)]
    # errors before any model loads
    monkeypatch.setattr(VideoGenerator, "__init__", lambda *a: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match="1 prompt.s. have a reference image and 1 do not"):
        plan_generation(_config(tiny_i2v_root, valid_video_csv=[str(csv)]))
    with pytest.raises(ValueError, match="--image_path: reference image .*missing.png' does not exist"):
        generate_plan = _config(tiny_i2v_root, image_path=str(tmp_path / "missing.png"))
        plan_generation(generate_plan)
    with pytest.raises(ValueError, match="--model_version 480p_t2v is a text-to-video transformer"):
        plan_generation(_config(tiny_i2v_root, image_path=str(image), model_version="480p_t2v"))
    assert generate.main(["--model_path", str(tiny_i2v_root), "--prompt", "x", "--image_path",
                          str(tmp_path / "missing.png")]) == 2


def test_generate_matches_diffusers_i2v_pipeline(tiny_i2v_root, tmp_path, monkeypatch):
    image_file = write_image(tmp_path / "wide.png", 30, 50, seed=3)
    config = _config(tiny_i2v_root, image_path=str(image_file), fixed_size="48x80")
    video, ours, latents, _ = render_beside_diffusers_i2v(config, monkeypatch)
    assert video.shape == (3, 5, 48, 80) and ours.shape == (1, 4, 2, 6, 10)
    torch.testing.assert_close(latents, ours, rtol=0, atol=1e-5)


def test_a_distilled_version_without_its_guider_config_is_not_sampled_at_the_default_guidance(tiny_i2v_root, tmp_path):
    import os

    from sage_grpo.config import ConfigError

    root = tmp_path / "root"
    root.mkdir()
    for entry in tiny_i2v_root.iterdir():
        if entry.name not in ("transformer", "variants"):
            os.symlink(entry, root / entry.name)
    (root / "transformer").mkdir()
    os.symlink(tiny_i2v_root / "transformer" / "480p_i2v", root / "transformer" / "480p_i2v_step_distilled")
    image = write_image(tmp_path / "a.png", 16, 16)
    common = dict(image_path=str(image), model_version="480p_i2v_step_distilled", flow_shift=5.0)
    with pytest.raises(ConfigError, match="'480p_i2v_step_distilled' is distilled.*variants/480p_i2v_step_distilled/"
                                          "guider/.*--variant 480p_i2v_step_distilled.*--guidance_scale"):
        plan_generation(_config(root, **common))
    plan = plan_generation(_config(root, guidance_scale=1.0, **common))  # explicit: used as given
    assert (plan.transformer_version, plan.guidance_scale, plan.flow_shift) == ("480p_i2v_step_distilled", 1.0, 5.0)

"""generate.py: input validation before any model loads, output naming, mp4 + JSON output, trained weights, e2e."""

import json
import subprocess
import sys
from pathlib import Path

import imageio
import pytest
import torch
from model_fixtures import tiny_root  # noqa: F401
from safetensors.torch import save_file

import generate
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import parse_cli
from sage_grpo.models import load_transformer
from sage_grpo.pipeline.generation import plan_generation
from sage_grpo.video_io import sanitize_name

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--fixed_size", "16x32", "--video_length", "5", "--num_inference_steps", "3", "--dtype", "fp32",
             "--device", "cpu"]


def write_csv(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def read_video(path: Path):
    frames = imageio.mimread(path)
    return len(frames), frames[0].shape


# ------------------------------------------------------------------ validation (no model is loaded)


@pytest.mark.parametrize("csv_text, message", [
    ("text,seed\nA cat,1\n", "no 'prompt' column"),
    ("prompt,seed\n", "has no prompts"),
    ("prompt,seed\nA cat,one\n", "line 2: seed 'one' is not an integer"),
])
def test_bad_csv_is_rejected(tmp_path, csv_text, message):
    config = GenerateConfig(valid_video_csv=[write_csv(tmp_path / "p.csv", csv_text)], model_path=str(tmp_path))
    with pytest.raises(ValueError, match=message):
        plan_generation(config)


def test_bad_inputs_fail_before_loading(tmp_path, capsys):
    absent = str(tmp_path / "no_such_ckpts")  # a model load would raise MissingCheckpointError instead
    with pytest.raises(ValueError, match="no prompt to render"):
        plan_generation(GenerateConfig(model_path=absent))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plan_generation(GenerateConfig(valid_video_csv=[str(tmp_path / "missing.csv")], model_path=absent))
    with pytest.raises(ValueError, match="HEIGHTxWIDTH"):
        plan_generation(GenerateConfig(prompt="A cat", fixed_size="480by864", model_path=absent))
    with pytest.raises(ValueError, match="multiple of the VAE's spatial ratio 16"):
        plan_generation(GenerateConfig(prompt="A cat", fixed_size="480x850", model_path=absent))
    with pytest.raises(ValueError, match="--resolution must be 480p or 720p"):
        plan_generation(GenerateConfig(prompt="A cat", resolution="1080p", model_path=absent))
    with pytest.raises(ValueError, match="--video_length must be 1 \\+ a multiple of 4"):
        plan_generation(GenerateConfig(prompt="A cat", video_length=120, model_path=absent))
    assert generate.main(["--prompt", "A cat", "--fixed_size", "big", "--model_path", absent]) == 2
    assert "error: size must look like HEIGHTxWIDTH" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse choices
        parse_cli(GenerateConfig, ["--resolution", "1080p"])


def test_reference_defaults_and_sizes(tmp_path):
    config = parse_cli(GenerateConfig, ["--prompt", "A cat", "--model_path", str(tmp_path)])
    assert (config.num_inference_steps, config.video_length, config.seed, config.negative_prompt) == (50, 121, 930, "")
    assert (config.guidance_scale, config.flow_shift, config.dtype, config.aspect_ratio) == (6.0, 5.0, "bf16", "16:9")
    plan = plan_generation(config)
    assert (plan.height, plan.width, plan.transformer_version) == (480, 864, "480p_t2v")
    plan = plan_generation(GenerateConfig(prompt="A cat", resolution="720p", model_path=str(tmp_path)))
    assert (plan.height, plan.width, plan.transformer_version) == (720, 1280, "720p_t2v")
    with pytest.warns(UserWarning, match="--sr is accepted for compatibility"):
        parse_cli(GenerateConfig, ["--prompt", "A cat", "--sr", "false"])


def test_prompts_seeds_and_output_names(tmp_path):
    csv_path = write_csv(tmp_path / "p.csv", 'prompt,seed\nA cat: "Hi!"  walks,5\n,7\nA dog,\n')
    config = GenerateConfig(valid_video_csv=[csv_path], prompt="ignored", seed=42,
                            output_path=str(tmp_path / "out" / "videos.mp4"), model_path=str(tmp_path))
    plan = plan_generation(config)
    assert [(i.prompt, i.seed) for i in plan.items] == [('A cat: "Hi!"  walks', 5), ("A dog", 42)]
    assert plan.output_paths == [tmp_path / "out" / "videos" / "sample_000_seed_5_A cat Hi walks.mp4",
                                 tmp_path / "out" / "videos" / "sample_001_seed_42_A dog.mp4"]
    single = plan_generation(GenerateConfig(prompt="A cat", output_path=str(tmp_path / "one.mp4"),
                                            model_path=str(tmp_path)))
    assert single.output_paths == [tmp_path / "one.mp4"] and single.items[0].seed == 930
    assert sanitize_name("a\tb\n  c/d*" + "x" * 80) == "a b cd" + "x" * 44


# ------------------------------------------------------------------ rendering on the tiny checkpoint


def test_generate_writes_videos_and_configs(tiny_root, tmp_path):
    csv_path = write_csv(tmp_path / "p.csv", 'prompt,seed\nA cat walks,3\nA sign that says "open",4\n')
    out = tmp_path / "samples.mp4"
    assert generate.main(["--model_path", str(tiny_root), "--valid_video_csv", csv_path, "--output_path", str(out),
                          *TINY_ARGS]) == 0
    videos = sorted((tmp_path / "samples").glob("*.mp4"))
    assert [v.name for v in videos] == ["sample_000_seed_3_A cat walks.mp4",
                                        "sample_001_seed_4_A sign that says open.mp4"]
    for video in videos:
        assert read_video(video) == (5, (16, 32, 3))
        settings = json.loads(video.with_name(f"{video.stem}_config.json").read_text())
        assert settings["transformer_version"] == "480p_t2v" and settings["num_inference_steps"] == 3
        assert (settings["height"], settings["width"]) == (16, 32)
    assert json.loads((tmp_path / "samples" / "sample_001_seed_4_A sign that says open_config.json").read_text())[
        "seed"] == 4
    assert imageio.get_reader(videos[0]).get_meta_data()["fps"] == 24


def test_generate_with_trained_weights(tiny_root, tmp_path):
    base, trained = tmp_path / "base.mp4", tmp_path / "trained.mp4"
    state = load_transformer(tiny_root, dtype=torch.float32).state_dict()
    generator = torch.Generator().manual_seed(0)
    checkpoint = tmp_path / "checkpoint-3" / "transformer"
    checkpoint.mkdir(parents=True)
    save_file({k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()},
              checkpoint / "model.safetensors")
    common = ["--model_path", str(tiny_root), "--prompt", "A cat walks", *TINY_ARGS]
    assert generate.main([*common, "--output_path", str(base)]) == 0
    assert generate.main([*common, "--output_path", str(trained), "--checkpoint_path", str(checkpoint.parent)]) == 0
    base_frames, trained_frames = imageio.mimread(base), imageio.mimread(trained)
    assert any((a != b).any() for a, b in zip(base_frames, trained_frames))
    assert json.loads((tmp_path / "trained_config.json").read_text())["checkpoint_path"] == str(checkpoint.parent)


def test_make_tiny_checkpoint_and_generate_end_to_end(tmp_path):
    """The two real entry points as subprocesses (timed by scripts/benchmark_tiny_generate.sh, not here)."""
    ckpts, video = tmp_path / "ckpts", tmp_path / "cat.mp4"
    subprocess.run([sys.executable, "scripts/make_tiny_checkpoint.py", "--output", str(ckpts), "--no_reward"],
                   cwd=REPO_ROOT, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "generate.py", "--model_path", str(ckpts), "--prompt", "A cat walks",
                             "--fixed_size", "32x48", "--video_length", "9", "--num_inference_steps", "4",
                             "--dtype", "fp32", "--output_path", str(video)],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_video(video) == (9, (32, 48, 3)) and (tmp_path / "cat_config.json").is_file()

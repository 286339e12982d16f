"""generate.py: input validation before any model loads, output naming, mp4 + JSON output, trained weights (single
file and sharded DCP), the speed flags, e2e."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import imageio
import pytest
import torch
from procs import run_group
from safetensors.torch import save_file

import generate
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import parse_cli
from sage_grpo.models import load_transformer
from sage_grpo.pipeline.generation import Acceleration, VideoGenerator, parse_block_ids, plan_generation
from sage_grpo.video_io import sanitize_name

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180  # per subprocess, scaled by SAGE_GRPO_TEST_TIMEOUT_SCALE; the two of the e2e test take 14 s on 2 cores
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
    ("prompt,seed\n", "p.csv' holds no prompts"),
    ("prompt,seed\nA cat,one\n", "p.csv, row 2: index and seed must be integers"),
])
def test_bad_csv_is_rejected(tmp_path, csv_text, message):
    config = GenerateConfig(valid_video_csv=[write_csv(tmp_path / "p.csv", csv_text)], model_path=str(tmp_path))
    with pytest.raises(ValueError, match=message):
        plan_generation(config)


def test_bad_inputs_fail_before_loading(tmp_path, capsys):
    absent = str(tmp_path / "no_such_ckpts")  # a model load would raise MissingCheckpointError instead
    with pytest.raises(ValueError, match="no prompt to render"):
        plan_generation(GenerateConfig(model_path=absent))
    with pytest.raises(ValueError, match="missing.csv' does not exist"):
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
    assert (config.guidance_scale, config.flow_shift, config.dtype, config.aspect_ratio) == (None, None, "bf16", "16:9")
    plan = plan_generation(config)
    assert plan.guidance_scale == 6.0  # no guider config in this root: the reference's CFG
    assert (plan.height, plan.width, plan.transformer_version, plan.flow_shift) == (480, 864, "480p_t2v", 5.0)
    plan = plan_generation(GenerateConfig(prompt="A cat", resolution="720p", model_path=str(tmp_path)))
    assert (plan.height, plan.width, plan.transformer_version, plan.flow_shift) == (720, 1280, "720p_t2v", 9.0)
    plan = plan_generation(GenerateConfig(prompt="A cat", resolution="720p", flow_shift=5.0, model_path=str(tmp_path)))
    assert plan.flow_shift == 5.0  # an explicit --flow_shift wins
    with pytest.raises(ValueError, match="--flow_shift must be > 0"):
        plan_generation(GenerateConfig(prompt="A cat", flow_shift=0.0, model_path=str(tmp_path)))
    with pytest.warns(UserWarning, match="--sr is accepted for compatibility"):
        parse_cli(GenerateConfig, ["--prompt", "A cat", "--sr", "false"])


def test_prompts_seeds_and_output_names(tmp_path):
    csv_path = write_csv(tmp_path / "p.csv", 'prompt,seed\nA cat: "Hi!"  walks,5\n,7\nA dog,\n')
    config = GenerateConfig(valid_video_csv=[csv_path], prompt="ignored", seed=42,
                            output_path=str(tmp_path / "out" / "videos.mp4"), model_path=str(tmp_path))
    plan = plan_generation(config)
    assert [(i.prompt, i.seed) for i in plan.items] == [('A cat: "Hi!"  walks', 5), ("A dog", 42)]
    assert plan.notes[0] == f"prompt CSV {csv_path}: 1 row(s) with an empty prompt skipped (line 3)"
    assert plan.output_paths == [tmp_path / "out" / "videos" / "sample_000_seed_5_A cat Hi walks.mp4",
                                 tmp_path / "out" / "videos" / "sample_001_seed_42_A dog.mp4"]
    single = plan_generation(GenerateConfig(prompt="A cat", output_path=str(tmp_path / "one.mp4"),
                                            model_path=str(tmp_path)))
    assert single.output_paths == [tmp_path / "one.mp4"] and single.items[0].seed == 930
    assert sanitize_name("a\tb\n  c/d*" + "x" * 80) == "a b cd" + "x" * 44


# ------------------------------------------------------------------ rendering on the tiny checkpoint


@pytest.mark.e2e
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
        assert (settings["height"], settings["width"], settings["flow_shift"]) == (16, 32, 5.0)  # resolved
    assert json.loads((tmp_path / "samples" / "sample_001_seed_4_A sign that says open_config.json").read_text())[
        "seed"] == 4
    assert imageio.get_reader(videos[0]).get_meta_data()["fps"] == 24


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_make_tiny_checkpoint_and_generate_end_to_end(tmp_path):
    """The two real entry points as subprocesses (timed by scripts/benchmark_tiny_generate.sh, not here)."""
    ckpts, video = tmp_path / "ckpts", tmp_path / "cat.mp4"
    made = run_group([sys.executable, "scripts/make_tiny_checkpoint.py", "--output", str(ckpts), "--no_reward"],
                     cwd=REPO_ROOT, timeout=TIMEOUT)
    assert made.returncode == 0, made.stderr[-2000:]
    result = run_group([sys.executable, "generate.py", "--model_path", str(ckpts), "--prompt", "A cat walks",
                        "--fixed_size", "32x48", "--video_length", "9", "--num_inference_steps", "4",
                        "--dtype", "fp32", "--output_path", str(video)], cwd=REPO_ROOT, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_video(video) == (9, (32, 48, 3)) and (tmp_path / "cat_config.json").is_file()


# ------------------------------------------------------------------ weight sources and speed flags


def _render(config):
    plan = plan_generation(config)
    return VideoGenerator(config, plan).render(plan.items[0])


def _small_config(root, **overrides):
    values = dict(model_path=str(root), prompt="A cat walks", seed=5, dtype="fp32", device="cpu", offloading=False,
                  fixed_size="16x16", video_length=5, num_inference_steps=3, text_max_length=16, byt5_max_length=8,
                  vision_num_semantic_tokens=4)
    values.update(overrides)
    return GenerateConfig(**values)


@pytest.mark.e2e
def test_sharded_dcp_checkpoint_loads_like_the_single_file(tiny_root, tmp_path):
    import torch.distributed.checkpoint as dcp

    from sage_grpo.export.weights import read_dcp_state_dict

    state = load_transformer(tiny_root, dtype=torch.float32).state_dict()
    generator = torch.Generator().manual_seed(1)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    single = tmp_path / "single" / "checkpoint-4"
    (single / "transformer").mkdir(parents=True)
    save_file(state, single / "transformer" / "model.safetensors")
    sharded = tmp_path / "sharded" / "checkpoint-4"
    # the nesting of the reference and of the sharded trainer: only "model" is read
    extra = {"optimizer": {"adamw": {"step": torch.ones(3)}}, "anchor": {"x": torch.zeros(2)}}
    dcp.save({"model": state, **extra}, checkpoint_id=str(sharded / "transformer_dcp"))
    dcp.save(state, checkpoint_id=str(tmp_path / "flat"))
    flat = read_dcp_state_dict(tmp_path / "flat")
    assert flat.keys() == state.keys() and all(torch.equal(flat[k], state[k]) for k in state)
    from_single = _render(_small_config(tiny_root, checkpoint_path=str(single)))
    assert torch.equal(_render(_small_config(tiny_root, checkpoint_path=str(sharded))), from_single)
    assert torch.equal(_render(_small_config(tiny_root, checkpoint_path=str(sharded / "transformer_dcp"))),
                       from_single)


def test_speed_flags_are_checked_before_loading(tmp_path):
    absent = str(tmp_path / "no_such_ckpts")
    plan = plan_generation(GenerateConfig(prompt="A cat", model_path=absent, device="cpu", group_offloading=True))
    assert plan.acceleration == Acceleration()  # nothing CUDA-only is applied on the CPU ...
    assert any("--offloading is skipped on cpu" in n for n in plan.notes)  # ... and the plan says so
    assert any("--group_offloading is skipped on cpu" in n for n in plan.notes)
    with pytest.raises(ValueError, match="needs CUDA and the sageattention package"):
        plan_generation(GenerateConfig(prompt="A cat", model_path=absent, device="cpu", use_sageattn=True))
    with pytest.raises(ValueError, match="cannot be combined"):
        plan_generation(GenerateConfig(prompt="A cat", model_path=absent, use_sageattn=True, sparse_attn=True))
    with pytest.raises(ValueError, match="--cache_type teacache: not available"):
        plan_generation(GenerateConfig(prompt="A cat", model_path=absent, enable_cache=True, cache_type="teacache"))
    with pytest.raises(ValueError, match="--no_cache_block_id 'x'"):
        plan_generation(GenerateConfig(prompt="A cat", model_path=absent, enable_cache=True, no_cache_block_id="x"))
    with pytest.raises(FileNotFoundError, match="--checkpoint_path .* no such file"):
        plan_generation(GenerateConfig(prompt="A cat", model_path=absent, checkpoint_path=absent))
    assert generate.main(["--prompt", "A cat", "--model_path", absent, "--lora_path", absent]) == 2
    cached = plan_generation(GenerateConfig(prompt="A cat", model_path=absent, device="cpu", enable_cache=True,
                                            cache_type="taylorcache", no_cache_block_id="1,53"))
    assert cached.acceleration.cache["max_order"] == 1 and cached.acceleration.cache["cache_interval"] == 4
    assert parse_block_ids("0-53", "--sage_blocks_range") == tuple(range(54))



def test_cuda_speed_flags_follow_the_gpu_memory(monkeypatch):
    """plan_acceleration's CUDA branch on the CPU, with a fake GPU: group offloading by default below 60 GiB (the
    reference's rule), model offloading when asked; explicit flags win."""
    from types import SimpleNamespace

    from sage_grpo.pipeline.generation import GROUP_OFFLOAD_BELOW_BYTES, plan_acceleration

    asked = []

    def fake_properties(device):
        asked.append(device)
        return SimpleNamespace(total_memory=memory)

    monkeypatch.setattr(torch.cuda, "get_device_properties", fake_properties)
    cuda = torch.device("cuda", 0)
    for memory, expected in ((GROUP_OFFLOAD_BELOW_BYTES - 1, True), (GROUP_OFFLOAD_BELOW_BYTES, False)):
        acceleration, notes = plan_acceleration(GenerateConfig(prompt="A cat"), cuda)
        assert acceleration.group_offload is expected and acceleration.model_offload is True and not notes
    assert asked == [cuda, cuda]
    memory = GROUP_OFFLOAD_BELOW_BYTES - 1
    explicit, _ = plan_acceleration(GenerateConfig(prompt="A cat", group_offloading=False, offloading=False), cuda)
    assert (explicit.group_offload, explicit.model_offload) == (False, False) and len(asked) == 2

@pytest.mark.e2e
def test_offloading_paths_and_the_cache_run_on_cpu(tiny_root):
    """Model offload and block-group offload (onloading to the CPU here) leave the video unchanged; the feature
    cache changes it a little and restarts fresh for every video."""
    config = _small_config(tiny_root, num_inference_steps=4)
    plan = plan_generation(config)
    item = plan.items[0]
    plain = VideoGenerator(config, plan).render(item)
    for acceleration in (Acceleration(model_offload=True, group_offload=True), Acceleration(group_offload=True)):
        assert torch.equal(VideoGenerator(config, replace(plan, acceleration=acceleration)).render(item), plain)
    cached_config = _small_config(tiny_root, num_inference_steps=4, enable_cache=True, cache_start_step=1,
                                  cache_end_step=3, cache_step_interval=2, no_cache_block_id="1")
    cached_plan = plan_generation(cached_config)
    generator = VideoGenerator(cached_config, cached_plan)
    first, second = generator.render(item), generator.render(item)
    assert torch.equal(first, second) and not torch.equal(first, plain)
    assert float((first - plain).abs().max()) < 0.5

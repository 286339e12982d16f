"""generate.py end to end: rendered videos, trained weights, sharded checkpoints, offloading, the tiny checkpoint
writer."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import imageio
import torch
from safetensors.torch import save_file
import generate

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.models import load_transformer
from sage_grpo.pipeline.acceleration import Acceleration
from sage_grpo.pipeline.generation import VideoGenerator, plan_generation

from procs import run_group
from generate_support import write_csv


REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180  # per subprocess, scaled by SAGE_GRPO_TEST_TIMEOUT_SCALE; the two of the e2e test take 14 s on 2 cores
TINY_ARGS = ["--fixed_size", "16x32", "--video_length", "5", "--num_inference_steps", "3", "--dtype", "fp32",
             "--device", "cpu"]


def read_video(path: Path):
    frames = imageio.mimread(path)
    return len(frames), frames[0].shape


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
    """The two real entry points as subprocesses (timed by benchmarks/benchmark_tiny_generate.sh, not here)."""
    ckpts, video = tmp_path / "ckpts", tmp_path / "cat.mp4"
    made = run_group([sys.executable, "scripts/make_tiny_checkpoint.py", "--output", str(ckpts), "--no_reward"],
                     cwd=REPO_ROOT, timeout=TIMEOUT)
    assert made.returncode == 0, made.stderr[-2000:]
    result = run_group([sys.executable, "generate.py", "--model_path", str(ckpts), "--prompt", "A cat walks",
                        "--fixed_size", "32x48", "--video_length", "9", "--num_inference_steps", "4",
                        "--dtype", "fp32", "--output_path", str(video)], cwd=REPO_ROOT, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_video(video) == (9, (32, 48, 3)) and (tmp_path / "cat_config.json").is_file()


def _render(config):
    plan = plan_generation(config)
    return VideoGenerator(config, plan).render(plan.items[0])


def _small_config(root, **overrides):
    values = dict(model_path=str(root), prompt="A cat walks", seed=5, dtype="fp32", device="cpu", offloading=False,
                  fixed_size="16x16", video_length=5, num_inference_steps=3, text_max_length=16, byt5_max_length=8,
                  vision_num_semantic_tokens=4)
    values.update(overrides)
    return GenerateConfig(**values)


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

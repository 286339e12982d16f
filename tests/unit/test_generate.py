"""generate.py: input validation before any model loads, output naming, mp4 + JSON output, trained weights (single
file and sharded DCP), the speed flags, e2e."""
import pytest
import torch
import generate

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import parse_cli
from sage_grpo.pipeline.acceleration import Acceleration, parse_block_ids
from sage_grpo.pipeline.generation import plan_generation
from sage_grpo.video_io import sanitize_name

from generate_support import write_csv


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
    with pytest.raises(ValueError, match=r"\[flow_shift-positive\] --flow_shift 0.0 must be > 0"):
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

    from sage_grpo.pipeline.acceleration import GROUP_OFFLOAD_BELOW_BYTES, plan_acceleration

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

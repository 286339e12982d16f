"""The benchmark scripts run whole (compiled with aot_eager, at the real width): the slow half of
tests/unit/test_bench.py."""
import re

import pytest

from bench_support import NUMBER, benchmark_module, generate_variants, run_benchmark, value_of, compiled_one_sp_rank


def test_benchmark_transformer_compiled_aot_eager_and_one_sp_rank(capsys):
    compiled_one_sp_rank(capsys, "aot_eager")


def test_benchmark_levers(capsys):
    """Two trainers of the tiny config (shrunk by trainer flags passed on), one step each: off, then on."""
    out = run_benchmark("benchmark_levers", capsys, "--config", "tiny", "--lever", "replay", "--repeats", "1",
                        "--warmup", "0", "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", "2",
                        "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16")
    assert "batch 2, 2 SDE steps, mini-batch 1, CFG 6.0, reward target_color" in out
    assert "lever replay: off --replay_group_size 1, on --replay_group_size 2" in out
    for name in ("off", "on"):
        assert value_of(rf"^{name}: step wall [0-9.]+ s \(median {NUMBER}\)", out) > 0
    assert value_of(rf"^ratio on / off: step wall [0-9.]+, process CPU [0-9.]+, training thread CPU {NUMBER}$", out) > 0


@pytest.fixture(scope="module")
def real_width_root(tmp_path_factory):
    """One real-width checkpoint (1 block, the narrow VAE) shared by the e2e runs below."""
    from sage_grpo.models.real_width import NARROW_VAE_CONFIG, write_real_width_hunyuan
    from sage_grpo.rewards.tiny import write_tiny_video_reward

    root = write_real_width_hunyuan(tmp_path_factory.mktemp("real_width"), num_layers=1, vae_config=NARROW_VAE_CONFIG)
    write_tiny_video_reward(root)
    return root


# 8 video tokens and short text streams: the real width's weights at the smallest activations
REAL_SMALL = ("--geometry", "real", "--frames", "5", "--height", "32", "--width", "32", "--repeats", "1", "--warmup",
              "0", "--threads", "2", "--text_max_length", "16", "--byt5_max_length", "8",
              "--vision_num_semantic_tokens", "4")


def test_benchmark_step_at_real_width(capsys, real_width_root):
    """The trainer at HunyuanVideo-1.5's width (1 block; LoRA keeps the CPU's memory small), with the tiny
    VideoAlign: every phase timed, the planner's estimate of each phase printed next to the (CPU: absent) peak,
    and the planner's transformer is the 1-block one that was loaded."""
    out = run_benchmark("benchmark_step", capsys, *REAL_SMALL, "--checkpoint_root", str(real_width_root), "--steps",
                        "1", "--use_lora", "true")  # a trainer flag passed on
    assert "geometry real: 1 blocks, hidden 2048, 8 video tokens (5x32x32)" in out
    assert "reward videoalign_local" in out
    planned = value_of(r"^planner sizes: transformer ([0-9]+) parameters \(1 blocks;", out)
    assert planned == 320_592_672 == value_of(r"the loaded policy has ([0-9]+) besides LoRA", out)
    shares = [value_of(rf"^{phase}: [0-9.]+ s, {NUMBER}% of the step$", out) for phase in
              benchmark_module("benchmark_step").PHASES]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    for phase in ("rollout", "decode", "policy update", "optimizer step"):
        assert value_of(rf"^memory {phase}: peak n/a, planned {NUMBER} GB", out) > 0
    # LoRA: no separate reference, its means are the policy's no-grad forwards, in the plan's reference phase
    assert re.search(r"^memory reference means: peak n/a, planned [0-9.]+ GB \(reference,", out, flags=re.MULTILINE)
    assert value_of(rf"^memory step: peak n/a, planned {NUMBER} GB", out) > 2.0  # the runtime overhead and more


def test_benchmark_generate_at_real_width(capsys, real_width_root):
    out = run_benchmark("benchmark_generate", capsys, *REAL_SMALL, "--checkpoint_root", str(real_width_root),
                        "--steps", "2", "--variants", "baseline,cache_deepcache")
    assert "geometry real: 1 blocks, hidden 2048, 8 video tokens (5x32x32)" in out
    results = generate_variants(out)
    assert set(results) == {"baseline", "cache_deepcache"}  # shared models, then its own
    assert all(isinstance(result, tuple) and result[0] > 0 for result in results.values()), results

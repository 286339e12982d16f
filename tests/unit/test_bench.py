"""The benchmarks (benchmarks/): the analytic FLOP
count against torch's FlopCounterMode (one device and one emulated SP rank), the real geometry's size and its refusal
on the CPU, each dual-stream block's saved bytes against the memory planner's per-block formula, and each script run
at the smallest size with one repeat, its printed lines parsed."""
import argparse
import re
from dataclasses import replace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from benchmarks import common as bench, memory as bench_memory
from benchmarks.sp_emulation import emulate_sp_rank

from sage_grpo.config import ConfigError
from sage_grpo.models.attention import install_joint_attention, remove_joint_attention

from bench_support import NUMBER, generate_variants, run_benchmark, benchmark_module, value_of, compiled_one_sp_rank


BLOCK_MEMORY_TOLERANCE = 0.10  # the planner's per-block saves against the measured ones (measured: exact in fp32)


def _setup(*argv) -> bench.BenchSetup:
    parser = argparse.ArgumentParser()
    bench.add_model_args(parser)
    return bench.setup_from_args(parser.parse_args(list(argv)))


@pytest.mark.parametrize("geometry", ["tiny", "toy"])
def test_analytic_flops_match_the_flop_counter(geometry):
    """FlopCounterMode counts the matmuls and attention (SDPA's math kernel, which it sees as matmuls) of one CFG
    forward and its backward; the analytic count is exact for the forward (norms and activations count 0 in both)
    and within 10% for forward + backward (3x forward; the first layers need no input gradient)."""
    setup = _setup("--geometry", geometry, "--threads", "2")
    transformer, vae = bench.build_models(setup)
    call = bench.VelocityCall.build(setup, transformer, vae, batch=1)
    for trimmed in (True, False):  # our joint attention, diffusers' processor over the padded text
        if not trimmed:
            remove_joint_attention(transformer)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
            with torch.no_grad():
                call.forward()
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as both:
            call.training_pass()
        install_joint_attention(transformer)
        analytic = call.flops(setup, trimmed=trimmed)
        assert analytic // 3 == forward.get_total_flops(), (geometry, trimmed)
        assert abs(analytic / both.get_total_flops() - 1) < 0.1, (geometry, trimmed)
    # the trim removes text tokens from every block: fewer FLOPs than over the padded text
    assert call.flops(setup, trimmed=True) < call.flops(setup, trimmed=False)


def test_real_geometry_is_the_8_33b_transformer():
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**bench.REAL_TRANSFORMER_CONFIG)
    params = sum(p.numel() for p in model.parameters())
    assert 8.30e9 < params < 8.36e9, params
    real = bench.GEOMETRIES["real"]
    assert bench.image_tokens(real, real.video) == 21 * 22 * 39  # 81 x 352 x 624, the reference launch
    assert bench.text_tokens(real, (0, 0), trimmed=False) == 1000 + 256 + 729
    # Each token passes through one stream's QKV, output and MLP (12 d^2 of the block's 24 d^2 + 12 d^2 adaLN
    # parameters), and attends over S = N + L: the blocks' share, to which the embedders add well under 5%.
    flops = bench.model_flops(real, real.video, 1, backward=False)
    tokens, hidden = 21 * 22 * 39 + sum(real.prompt_valid), 2048
    blocks = 54 * (2 * tokens * 12 * hidden ** 2 + 4 * tokens ** 2 * hidden)
    assert blocks < flops < 1.05 * blocks


def test_real_geometry_on_the_cpu_needs_blocks():
    with pytest.raises(SystemExit, match="--blocks N"):
        _setup("--geometry", "real", "--device", "cpu")
    with pytest.raises(SystemExit, match="--blocks must be >= 1"):
        _setup("--geometry", "real", "--device", "cpu", "--blocks", "0")
    setup = _setup("--geometry", "real", "--device", "cpu", "--blocks", "1")
    assert setup.geometry.num_layers == 1 and setup.video == (81, 352, 624) and setup.dtype == torch.float32
    assert setup.geometry.build_on_device


def test_checkpoint_geometry_takes_the_vae_flag_or_the_written_configs(tmp_path):
    from sage_grpo.models.real_width import NARROW_VAE_CONFIG, REAL_VAE_CONFIG

    parser = argparse.ArgumentParser()
    bench.add_model_args(parser)
    bench.add_checkpoint_args(parser)
    real = bench.GEOMETRIES["real"].with_blocks(2)
    for vae, config in (("real", REAL_VAE_CONFIG), ("narrow", NARROW_VAE_CONFIG)):
        args = parser.parse_args(["--vae", vae])
        assert bench.checkpoint_geometry(real, args).vae_config == config
    tiny = bench.GEOMETRIES["tiny"]
    assert bench.checkpoint_geometry(tiny, parser.parse_args(["--vae", "real"])) == tiny  # real only
    with pytest.raises(SystemExit, match="missing .*config.json"):
        bench.checkpoint_geometry(real, parser.parse_args(["--checkpoint_root", str(tmp_path)]))
    # with a written checkpoint, --geometry real needs no --blocks on the CPU: its configs set the depth
    args = parser.parse_args(["--geometry", "real", "--device", "cpu", "--checkpoint_root", str(tmp_path)])
    assert bench.setup_from_args(args).geometry.name == "real"


def test_peak_tflops():
    assert bench.peak_tflops(torch.device("cpu")) is None
    assert bench.peak_tflops(torch.device("cpu"), 123.0) == 123.0
    table = dict(bench.PEAK_BF16_TFLOPS)
    assert table["H100"] == table["H200"] == 989.0 and table["A100"] == 312.0


def _relative_rounding(text: str) -> float:
    """Half a unit of the last printed digit of ``text`` ("0.0194", "9.876e-05"), relative to its value."""
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals) / float(text)


def test_printed_rounding_reads_both_notations():
    assert _relative_rounding("0.0194") == pytest.approx(0.5e-4 / 0.0194)
    assert _relative_rounding("9.876e-05") == pytest.approx(0.5e-8 / 9.876e-05)


def test_benchmark_transformer(capsys):
    out = run_benchmark("benchmark_transformer", capsys, "--geometry", "tiny", "--repeats", "1", "--warmup", "0",
                        "--threads", "2")
    flops = value_of(rf"^model FLOPs per pass \(forward \+ backward, analytic\): {NUMBER} TFLOP$", out)
    for mode in ("off", "on"):
        seconds = value_of(rf"^checkpointing {mode}: {NUMBER} s, ", out)
        rate = value_of(rf"^checkpointing {mode}: [0-9.]+ s, {NUMBER} TFLOP/s$", out)  # the CPU: no MFU
        # both printed to 3-4 significant digits: the ratio holds within their rounding (0.0194 s is +-2.6e-3); a
        # slow machine prints a rate below 1e-4 in exponent form (9.876e-05)
        shown = re.search(rf"^checkpointing {mode}: {NUMBER} s, {NUMBER} TFLOP/s$", out, re.M).groups()
        rounding = sum(_relative_rounding(text) for text in shown)
        assert seconds > 0 and rate == pytest.approx(flops / seconds, rel=rounding + 1e-4)
        ratio = value_of(rf"^saved per block, checkpointing {mode}: .*ratio planner / measured {NUMBER} ", out)
        assert abs(ratio - 1) <= BLOCK_MEMORY_TOLERANCE
    assert value_of(rf"^ratio checkpointing on / off: {NUMBER}$", out) > 0
    assert "compiled" not in out  # --compile off by default


def test_benchmark_transformer_compiled_and_one_sp_rank(capsys):
    compiled_one_sp_rank(capsys, "eager")


@pytest.mark.parametrize("sp", [1, 2])
@pytest.mark.parametrize("geometry", ["tiny", "toy"])
def test_saved_bytes_per_block_match_the_planner(geometry, sp):
    """What each dual-stream block saves for backward (saved-tensor hook, fp32, one CFG call of 2 rows) against the
    planner's per-block formulas, with checkpointing off and on, on one device and one emulated rank of sp 2."""
    setup = _setup("--geometry", geometry, "--threads", "2")
    transformer, vae = bench.build_models(setup)
    emulate_sp_rank(transformer, sp, setup.attention_backend)
    call = bench.VelocityCall.build(setup, transformer, vae, batch=1)
    transformer.train()
    config = setup.geometry.transformer_config
    video = bench.image_tokens(setup.geometry, setup.video)
    text = bench.text_tokens(setup.geometry, setup.geometry.prompt_valid, trimmed=True)  # the longer prompt's
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    for checkpointing in (False, True):
        measured = bench_memory.measure_saved_bytes(transformer, call.forward, checkpointing)
        planned = bench_memory.planned_block_bytes(config, video, text, sp, call.rows, 4,
                                                   checkpointing)
        print(f"{geometry} sp {sp} checkpointing {checkpointing}: measured {measured.blocks} B per block, "
              f"planned {planned} B, ratio {planned / measured.per_block:.4f}")
        assert abs(planned / measured.per_block - 1) <= BLOCK_MEMORY_TOLERANCE
        if checkpointing:  # a checkpointed block keeps its two stream inputs: 2 rows x (n + T) x D x 4 bytes
            assert measured.blocks[1] == 2 * (video // sp + text) * hidden * 4
        assert measured.outside > 0 and len(measured.blocks) == setup.geometry.num_layers
    # the meter leaves the model as it found it: no hooks, checkpointing off
    assert not transformer.gradient_checkpointing
    assert all(len(block._forward_hooks) == 0 for block in transformer.transformer_blocks)


def test_sp_rank_flops_match_the_flop_counter():
    """One emulated rank of sp 2: the analytic count (N/2 tokens in the streams, attention over S with H/2 heads) is
    exact for the forward against FlopCounterMode, and within 10% for forward + backward."""
    setup = _setup("--geometry", "toy", "--threads", "2")
    transformer, vae = bench.build_models(setup)
    emulate_sp_rank(transformer, 2, setup.attention_backend)
    call = bench.VelocityCall.build(setup, transformer, vae, batch=1)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        with torch.no_grad():
            call.forward()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as both:
        call.training_pass()
    analytic = call.flops(setup, sp=2)
    assert analytic // 3 == forward.get_total_flops()
    assert abs(analytic / both.get_total_flops() - 1) < 0.1
    assert analytic < call.flops(setup)  # half the tokens in the streams, half the heads in attention
    with pytest.raises(ConfigError, match="pick a divisor of 4"):
        emulate_sp_rank(transformer, 3, None)


def test_benchmark_attention(capsys):
    out = run_benchmark("benchmark_attention", capsys, "--geometry", "tiny", "--repeats", "1", "--warmup", "0",
                        "--threads", "2")
    # tiny: 8 video tokens + 16 MLLM + 8 byT5 + 4 image slots; CFG: 2 rows
    assert value_of(r"^dense mask avoided: 2 x 36 x 36 bool = ([0-9.]+) MiB", out) == pytest.approx(0.0, abs=0.05)
    assert value_of(rf"^dense mask \(diffusers' processor\): {NUMBER} s$", out) > 0
    for backend in ("native", "_native_math"):
        assert value_of(rf"^joint attention, {backend}: [0-9.]+ s, ratio dense / ours {NUMBER}, ", out) > 0
        assert value_of(rf"^joint attention, {backend}: .*max \|velocity difference\| {NUMBER}$", out) < 1e-4
        # the CFG rows split into mask-free calls: the masked call's velocity within float order
        assert value_of(rf"^joint attention, {backend}, split rows: [0-9.]+ s, ratio masked / split {NUMBER}, ", out) > 0
        assert value_of(rf"^joint attention, {backend}, split rows: .*masked call\| {NUMBER}$", out) < 1e-5
        assert value_of(rf"^joint attention, {backend}, process CPU .* ratio masked / split {NUMBER}$", out) > 0


def test_benchmark_mixed_length_attention(capsys):
    """The CFG pair's attention call four ways: every one the masked call's output within float order."""
    out = run_benchmark("benchmark_mixed_length_attention", capsys, "--sizes", "tiny", "--repeats", "1", "--warmup",
                        "0", "--backward")
    assert "tiny: 2 rows, 2 heads x 8, 20 tokens, keys 11 / 20, forward + backward, medians of 1" in out
    for call in ("masked", "split", "nested"):
        assert value_of(rf"^  {call}: [0-9.]+ ms process CPU, ratio to masked {NUMBER}, ", out) > 0
        assert value_of(rf"^  {call}: .*max \|difference to masked\| {NUMBER}$", out) < 1e-6
    assert "  flex: not run (FlexAttention does not support backward on CPU." in out  # torch 2.13


def test_benchmark_rollout(capsys):
    out = run_benchmark("benchmark_rollout", capsys, "--geometry", "tiny", "--steps", "2", "--repeats", "1", "--warmup",
                        "0", "--threads", "2")
    ours = value_of(rf"^ours \(Sampler.rollout, joint attention native, 2 per forward\): {NUMBER} s$", out)
    theirs = value_of(rf"^diffusers \(HunyuanVideo15Pipeline, dense-mask processor\): {NUMBER} s$", out)
    assert value_of(rf"^ratio diffusers / ours: {NUMBER}$", out) == pytest.approx(theirs / ours, abs=0.01)
    assert value_of(rf"^max \|final latent difference\|: {NUMBER} ", out) < 1e-4  # the ODE parity, fp32


def test_step_phases_are_the_best_of_the_measured_steps():
    step = benchmark_module("benchmark_step")
    rows = [dict(step=1, rollout_time=20.0, reward_time=9.0, ref_model_time=9.0, grpo_loop_time=9.0),  # warm-up
            dict(step=2, rollout_time=3.0, reward_time=0.5, ref_model_time=1.0, grpo_loop_time=4.0),
            dict(step=3, rollout_time=2.0, reward_time=0.7, ref_model_time=0.8, grpo_loop_time=5.0)]
    encode, decode = {0: 5.0, 1: 0.5, 2: 0.25}, {0: 5.0, 1: 0.5, 2: 0.25}  # keyed by global_step = step - 1
    optimizer = {0: 2.0, 1: 1.5, 2: 0.5}  # the optimizer step runs inside grpo_loop_time
    phases = step.phase_seconds(rows, encode, decode, warmup=1, optimizer=optimizer)
    # rollout = rollout_time - encode - decode: 3 - 0.5 - 0.5 = 2.0 at step 2, 2 - 0.25 - 0.25 = 1.5 at step 3;
    # policy update = grpo_loop_time - optimizer: 4 - 1.5 = 2.5 at step 2, 5 - 0.5 = 4.5 at step 3
    assert phases == {"encode": 0.25, "rollout": 1.5, "decode": 0.25, "reward": 0.5, "reference means": 0.8,
                      "policy update": 2.5, "optimizer step": 0.5}
    assert list(phases) == list(step.PHASES)
    # a run that never stepped the optimizer (every update skipped) counts it as 0 s, not a KeyError
    assert step.phase_seconds(rows, encode, decode, warmup=1, optimizer={})["policy update"] == 4.0
    with pytest.raises(SystemExit, match="raise --repeats"):
        step.phase_seconds(rows[:1], encode, decode, warmup=1, optimizer=optimizer)


def test_step_memory_lines_against_the_plan():
    """measured / planned is taken against the planner's phase without its runtime overhead (which the CUDA peak
    counter does not see); a phase the plan lacks falls back (reference means: rollout) or says so (encode)."""
    from sage_grpo.models.placement import Placement
    from sage_grpo.plan.memory import Component, MemoryPlan, Phase

    step = benchmark_module("benchmark_step")
    gib = 2 ** 30
    overhead = Component(step.RUNTIME_OVERHEAD, 2 * gib)
    plan = MemoryPlan((Phase("rollout", (Component("weights", 8 * gib), overhead)),
                       Phase("train", (Component("weights", 8 * gib), Component("activations", 12 * gib), overhead))),
                      Placement(False, False), 80.0)
    line = step.memory_line("policy update", 25.0, plan)
    assert value_of(rf"planned {NUMBER} GB \(train, without the 2.0 GB runtime overhead\)", line) == 20.0
    assert value_of(rf"measured / planned {NUMBER}$", line) == pytest.approx(1.25)
    assert "(rollout, " in step.memory_line("reference means", 4.0, plan)
    assert step.memory_line("encode", None, plan) == "peak n/a, planned n/a (the plan has no encode phase)"
    assert step.memory_line("rollout", None, plan).endswith("measured / planned n/a")


def test_phase_memory_is_the_largest_peak_after_the_warmup():
    step = benchmark_module("benchmark_step")
    memory = step.PhaseMemory(trainer=None, device=torch.device("cpu"))
    memory.mark("rollout")  # off CUDA nothing is recorded
    assert memory.phase_gib(warmup=0) == {}
    gib = 2 ** 30
    memory.peaks = {("rollout", 0): 50 * gib, ("rollout", 1): 3 * gib, ("rollout", 2): 4 * gib,
                    ("decode", 1): 1 * gib}
    assert memory.phase_gib(warmup=1) == {"rollout": 4.0, "decode": 1.0}


def test_benchmark_generate(capsys):
    out = run_benchmark("benchmark_generate", capsys, "--geometry", "tiny", "--steps", "2", "--repeats", "1",
                        "--warmup", "0", "--threads", "2", "--variants",
                        "baseline,cfg_distilled,vae_tiling,offloading,sparse_attn")
    results = generate_variants(out)
    assert list(results) == ["baseline", "cfg_distilled", "vae_tiling", "offloading", "sparse_attn"]
    base = results["baseline"]
    assert base[0] > 0 and base[1] == "n/a" and base[2] == 1.0  # the CPU: no peak counter
    # the ratio is printed from the unrounded times (3 decimals); the times are printed to 4 decimals: the ratio
    # recomputed from them may differ by the printing's rounding alone
    seconds, ratio = results["cfg_distilled"][0], results["cfg_distilled"][2]
    rounding = 5e-4 + (seconds / base[0]) * (5e-5 / seconds + 5e-5 / base[0]) * 1.01
    assert ratio == pytest.approx(seconds / base[0], abs=rounding)
    assert results["offloading"].startswith("skipped: --offloading is skipped on cpu")
    assert results["sparse_attn"].startswith("skipped: generate.py accepts the flag, but the feature is not")
    with pytest.raises(SystemExit, match="--variants warp: unknown"):
        run_benchmark("benchmark_generate", capsys, "--geometry", "tiny", "--variants", "warp")


def test_generate_cache_schedule_scales_the_references():
    generate = benchmark_module("benchmark_generate")
    flags = generate.cache_flags(50, "deepcache")
    assert flags[flags.index("--cache_start_step") + 1] == "11" and flags[flags.index("--cache_end_step") + 1] == "45"
    assert flags[flags.index("--cache_step_interval") + 1] == "4"
    short = generate.cache_flags(4, "taylorcache")
    start, end = int(short[short.index("--cache_start_step") + 1]), int(short[short.index("--cache_end_step") + 1])
    assert 1 <= start < end <= 4


def test_generate_variants_name_the_unusable_backends():
    generate = benchmark_module("benchmark_generate")
    chosen = generate.selected(generate.variants(20, ["_native_math"], {"flash": "flash-attn is missing"}),
                               "baseline,attention")
    assert [(v.name, v.skip) for v in chosen] == [("baseline", ""), ("attention _native_math", ""),
                                                  ("attention flash", "flash-attn is missing")]
    assert generate.plan_variant(chosen[2], [], []) == "flash-attn is missing"  # reported as skipped, never run


def test_cuda_allocator_numbers_are_differences_from_the_start(monkeypatch):
    """measure_cuda_memory's arithmetic with the allocator's counters faked (no GPU here): what the forward keeps is
    the allocation after it minus before, the peak is the allocator's peak minus before; the backward runs."""
    counters = iter([100, 350])  # memory_allocated before and after the forward
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(counters))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 900)
    weight = torch.nn.Parameter(torch.ones(3))
    memory = bench_memory.measure_cuda_memory(torch.device("cpu"), lambda: weight * 2.0)
    assert (memory.forward_kept, memory.peak) == (250, 800)
    assert torch.equal(weight.grad, torch.full((3,), 8.0 / 3))  # d mean((2w)^2) / dw = 8w / 3


def test_benchmark_transformer_prints_the_allocator_lines_on_cuda(capsys, monkeypatch):
    """The script's CUDA branch of the memory report, run on the CPU with the allocator's counters faked: 2 MiB kept
    by the forward of the tiny model's 2 blocks, 3 MiB peak."""
    counters = iter([0, 2 * 2 ** 20])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(counters))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 20)
    setup = _setup("--geometry", "tiny", "--threads", "2")
    transformer, vae = bench.build_models(setup)
    call = bench.VelocityCall.build(setup, transformer, vae, batch=1)
    transformer.train()
    script = benchmark_module("benchmark_transformer")
    script.report_block_memory(call, replace(setup, device=torch.device("cuda")), "on", 1)
    out = capsys.readouterr().out
    assert value_of(rf"^allocator, checkpointing on: forward keeps {NUMBER} MiB \(", out) == 2.0
    assert value_of(rf"^allocator, .* \({NUMBER} MiB per block, outside included\)", out) == 1.0
    assert value_of(rf"^allocator, .*; peak above the weights {NUMBER} MiB", out) == 3.0
    planned = value_of(rf"^saved per block, checkpointing on: .*, planner {NUMBER} MiB", out)
    assert value_of(rf"^allocator, .*planner's blocks {NUMBER} MiB", out) == pytest.approx(2 * planned, abs=0.1)

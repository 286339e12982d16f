"""The benchmarks (scripts/benchmark_*.py, sage_grpo/bench.py; issue 13 item 8): the analytic FLOP count against
torch's FlopCounterMode, the real geometry's size and its refusal on the CPU, and each script run at the smallest
size with one repeat, its printed lines parsed."""

import argparse
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from sage_grpo import bench
from sage_grpo.models.attention import install_joint_attention, remove_joint_attention

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
NUMBER = r"(-?[0-9.]+(?:e[-+]?\d+)?)"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name: str, capsys, *argv) -> str:
    _script(name).main(list(argv))
    return capsys.readouterr().out


def _value(pattern: str, text: str) -> float:
    match = re.search(pattern, text, flags=re.MULTILINE)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return float(match.group(1))


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
    with pytest.raises(ValueError, match="built on the device"):
        with bench.checkpoint(setup.geometry):
            pass


def test_peak_tflops():
    assert bench.peak_tflops(torch.device("cpu")) is None
    assert bench.peak_tflops(torch.device("cpu"), 123.0) == 123.0
    table = dict(bench.PEAK_BF16_TFLOPS)
    assert table["H100"] == table["H200"] == 989.0 and table["A100"] == 312.0


def test_benchmark_transformer(capsys):
    out = _run("benchmark_transformer", capsys, "--geometry", "tiny", "--repeats", "1", "--warmup", "0",
               "--threads", "2")
    flops = _value(rf"^model FLOPs per pass \(forward \+ backward, analytic\): {NUMBER} TFLOP$", out)
    for mode in ("off", "on"):
        seconds = _value(rf"^checkpointing {mode}: {NUMBER} s, ", out)
        rate = _value(rf"^checkpointing {mode}: [0-9.]+ s, {NUMBER} TFLOP/s$", out)  # the CPU: no MFU
        assert seconds > 0 and rate == pytest.approx(flops / seconds, rel=2e-3)
    assert _value(rf"^ratio checkpointing on / off: {NUMBER}$", out) > 0


def test_benchmark_attention(capsys):
    out = _run("benchmark_attention", capsys, "--geometry", "tiny", "--repeats", "1", "--warmup", "0",
               "--threads", "2")
    # tiny: 8 video tokens + 16 MLLM + 8 byT5 + 4 image slots; CFG: 2 rows
    assert _value(r"^dense mask avoided: 2 x 36 x 36 bool = ([0-9.]+) MiB", out) == pytest.approx(0.0, abs=0.05)
    assert _value(rf"^dense mask \(diffusers' processor\): {NUMBER} s$", out) > 0
    for backend in ("native", "_native_math"):
        assert _value(rf"^joint attention, {backend}: [0-9.]+ s, ratio dense / ours {NUMBER}, ", out) > 0
        assert _value(rf"^joint attention, {backend}: .*max \|velocity difference\| {NUMBER}$", out) < 1e-4


def test_benchmark_rollout(capsys):
    out = _run("benchmark_rollout", capsys, "--geometry", "tiny", "--steps", "2", "--repeats", "1", "--warmup",
               "0", "--threads", "2")
    ours = _value(rf"^ours \(Sampler.rollout, joint attention native, 2 per forward\): {NUMBER} s$", out)
    theirs = _value(rf"^diffusers \(HunyuanVideo15Pipeline, dense-mask processor\): {NUMBER} s$", out)
    assert _value(rf"^ratio diffusers / ours: {NUMBER}$", out) == pytest.approx(theirs / ours, abs=0.01)
    assert _value(rf"^max \|final latent difference\|: {NUMBER} ", out) < 1e-4  # the ODE parity, fp32


@pytest.mark.e2e
def test_benchmark_step(capsys):
    out = _run("benchmark_step", capsys, "--geometry", "tiny", "--steps", "2", "--repeats", "1", "--warmup", "0",
               "--threads", "2", "--use_muon", "false")  # a trainer flag passed on
    shares = [_value(rf"^{phase}: [0-9.]+ s, {NUMBER}% of the step$", out) for phase in
              ("encode", "rollout", "decode", "reward", "reference means", "policy update")]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    assert _value(rf"^step \(sum of the phases, each the best of 1 steps\): {NUMBER} s$", out) > 0
    assert "trainer: batch 2 x 2 generations, 2 SDE steps, 5x16x16 videos" in out


def test_step_phases_are_the_best_of_the_measured_steps():
    step = _script("benchmark_step")
    rows = [dict(step=1, rollout_time=20.0, reward_time=9.0, ref_model_time=9.0, grpo_loop_time=9.0),  # warm-up
            dict(step=2, rollout_time=3.0, reward_time=0.5, ref_model_time=1.0, grpo_loop_time=4.0),
            dict(step=3, rollout_time=2.0, reward_time=0.7, ref_model_time=0.8, grpo_loop_time=5.0)]
    encode, decode = {0: 5.0, 1: 0.5, 2: 0.25}, {0: 5.0, 1: 0.5, 2: 0.25}  # keyed by global_step = step - 1
    phases = step.phase_seconds(rows, encode, decode, warmup=1)
    # rollout = rollout_time - encode - decode: 3 - 0.5 - 0.5 = 2.0 at step 2, 2 - 0.25 - 0.25 = 1.5 at step 3
    assert phases == {"encode": 0.25, "rollout": 1.5, "decode": 0.25, "reward": 0.5, "reference means": 0.8,
                      "policy update": 4.0}
    assert list(phases) == list(step.PHASES)
    with pytest.raises(SystemExit, match="raise --repeats"):
        step.phase_seconds(rows[:1], encode, decode, warmup=1)

"""Helpers shared by unit/test_bench.py and e2e/test_bench_runs.py."""
import importlib.util
import re
from pathlib import Path

import pytest


SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks"
NUMBER = r"(-?[0-9.]+(?:e[-+]?\d+)?)"


def benchmark_module(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark(name: str, capsys, *argv) -> str:
    benchmark_module(name).main(list(argv))
    return capsys.readouterr().out


def value_of(pattern: str, text: str) -> float:
    match = re.search(pattern, text, flags=re.MULTILINE)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return float(match.group(1))


def compiled_one_sp_rank(capsys, backend):
    """--compile on and --sp 2 (half the video tokens per rank) with the compile ``backend``: eager (dynamo's graphs of
    each block, run by eager torch) or, slower, aot_eager (AOTAutograd's forward and backward graphs, checkpointed
    blocks included); inductor, the default, took over 5 minutes on the tiny model on this 2-core CPU (its C++
    kernels)."""
    out = run_benchmark("benchmark_transformer", capsys, "--geometry", "tiny", "--repeats", "1", "--warmup", "0",
                        "--threads", "2", "--compile", "on", "--compile_backend", backend, "--sp", "2")
    assert "one rank of sp 2: 4 video tokens per rank, attention over all tokens with 1 of 2 heads" in out
    for mode in ("off", "on"):
        assert value_of(rf"^compile \+ first pass \(checkpointing {mode}, compiled\): {NUMBER} s$", out) > 0
        assert value_of(rf"^checkpointing {mode}, compiled: {NUMBER} s, ", out) > 0
    assert "saved per block" not in out  # the saved-tensor meter measures the eager passes only
    with pytest.raises(SystemExit, match="--sp 3: the transformer has 2 attention heads"):
        benchmark_module("benchmark_transformer").main(["--geometry", "tiny", "--sp", "3", "--threads", "2"])


def generate_variants(out: str) -> dict:
    """variant name -> (seconds, peak text, ratio) or the skip/failure reason."""
    results = {}
    for name, rest in re.findall(r"^variant ([^:]+): (.*)$", out, flags=re.MULTILINE):
        timed = re.match(rf"{NUMBER} s per video, peak (n/a|[0-9.]+ GB), ratio to baseline {NUMBER}$", rest)
        results[name] = (float(timed.group(1)), timed.group(2), float(timed.group(3))) if timed else rest
    return results

"""The GPU runner's CPU mode end to end (scripts/gpu_session.py --cpu): every part's command at the tiny geometry, the
step's checkpoint written in the background, the results as the files that come back from the GPU machine."""
import os
import sys

import pytest

from bench_support import NUMBER, benchmark_module, value_of
from gpu_session_support import REPO_ROOT, RUNNER, summary
from procs import run_group

# one quick device test stands in for the tier (the unit tier runs them all on the CPU)
DEVICE_TEST = "tests/unit/test_device.py::test_replay_reproduces_rollout_log_probs_exactly[fp32-cps]"


def test_cpu_mode_runs_every_part(tmp_path):
    out = tmp_path / "out"
    proc = run_group([sys.executable, str(RUNNER), "--cpu", "--tests", DEVICE_TEST], cwd=REPO_ROOT,
                     env={**os.environ, "OUT": str(out)}, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert summary(out) == [("check", "gpu_check", "0"), ("check", "device_tier", "0"), ("mfu", "mfu", "0"),
                            ("step", "checkpoint", "0"), ("step", "step", "0"), ("attention", "attention", "0"),
                            ("rollout", "rollout", "0")]
    # what comes back from the GPU machine: at most 8 files, no folder
    assert sorted(path.name for path in out.iterdir()) == ["attention.log", "check.log", "env.txt", "mfu.log",
                                                           "rollout.log", "step.log", "summary.tsv"]
    check = (out / "check.log").read_text()
    imported = value_of(r"^imported ([0-9]+) of ", check)
    assert f"imported {imported:.0f} of {imported:.0f} sage_grpo modules" in check and imported > 100
    assert "check: OK" in check and value_of(r"^([0-9]+) passed in ", check) == 1
    mfu = (out / "mfu.log").read_text()
    for mode in ("off", "on"):
        assert value_of(rf"^saved per block, checkpointing {mode}: .*ratio planner / measured {NUMBER} ", mfu) == \
            pytest.approx(1.0, abs=0.01)
    step = (out / "step.log").read_text()
    assert "=== step/checkpoint (background) (limit " in step and "wrote tiny checkpoint to " in step
    shares = [value_of(rf"^{phase}: [0-9.]+ s, {NUMBER}% of the step$", step) for phase in
              benchmark_module("benchmark_step").PHASES]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    assert value_of(rf"^optimizer step: {NUMBER} s", step) > 0  # timed apart from the policy update
    assert "trainer: batch 2 x 2 generations, 2 SDE steps, 5x16x16 videos" in step
    attention = (out / "attention.log").read_text()
    assert value_of(rf"^joint attention, native, no key mask: .*max \|velocity difference\| {NUMBER}$",
                    attention) < 1e-4
    assert value_of(rf"^max \|final latent difference\|: {NUMBER} ", (out / "rollout.log").read_text()) < 1e-4
    assert "cut: generate.py's speed flags" in (out / "env.txt").read_text()
    assert "summary (" in proc.stdout and "0 command(s) failed" in proc.stdout
    checkpoint = next(line.split("--output ")[1].split()[0] for line in step.splitlines() if "--output " in line)
    assert not os.path.exists(checkpoint)  # the temporary checkpoint is removed

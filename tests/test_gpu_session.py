"""scripts/gpu_session.sh, the GPU runbook's runner, on the CPU: its `check` part end to end, its time limits, and
the refusals that keep a GPU session from spending device minutes on a typo (docs/gpu_runbook.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from procs import run_group

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNNER = ["bash", str(REPO_ROOT / "scripts" / "gpu_session.sh")]


def _run(args, out_dir: Path, timeout: float, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OUT": str(out_dir), "SAGE_GPU_PYTHON": sys.executable, **env}
    return run_group(RUNNER + list(args), cwd=REPO_ROOT, env=environ, timeout=timeout)


def _summary(out_dir: Path) -> list:
    """(part, label, exit status) of each line of summary.tsv."""
    return [tuple(line.split("\t")[:3]) for line in (out_dir / "summary.tsv").read_text().splitlines()]


@pytest.mark.parametrize("args, message", [
    ([], "usage: bash scripts/gpu_session.sh"),
    (["bogus"], "unknown part 'bogus': use check, tests, kernels, step, generate, extra or all"),
    (["--cpu", "check", "kernels"], "part kernels times the real-width model and needs a GPU"),
])
def test_runner_refuses_bad_parts_before_doing_anything(tmp_path, args, message):
    out = tmp_path / "out"
    proc = _run(args, out, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr
    assert not out.exists()  # nothing installed, described or run


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout (the device machine's copy)")
def test_carried_wheels_and_runner_output_stay_out_of_git():
    proc = run_group(["git", "check-ignore", ".whl/diffusers-0.42.1-py3-none-any.whl", "gpu_out/check.log"],
                     cwd=REPO_ROOT, timeout=30)
    assert proc.returncode == 0 and len(proc.stdout.split()) == 2, proc.stdout + proc.stderr


@pytest.mark.e2e
def test_check_part_runs_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    proc = _run(["--cpu", "check"], out, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _summary(out) == [("check", "gpu_check", "0")]
    log = (out / "check.log").read_text()
    assert "check: OK" in log and "tiny pass on cpu torch.float32" in log
    imported = next(line for line in log.splitlines() if line.startswith("imported "))
    done, total = imported.split()[1], imported.split()[3]
    assert done == total and int(total) > 50, imported  # every sage_grpo module
    assert f"torch {torch.__version__}" in (out / "env.txt").read_text()


@pytest.mark.e2e
def test_a_hanging_command_is_killed_and_the_part_goes_on(tmp_path):
    """A stand-in python that hangs on every command: the first test command is killed at the part's budget (exit
    124, no process left behind), the next one is recorded as skipped, and the runner exits non-zero."""
    pids = tmp_path / "pids"
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    'if [[ $1 == - ]]; then cat >/dev/null; echo "torch stand-in"; exit 0; fi\n'
                    f'echo $$ >>"{pids}"\n'
                    "exec sleep 300\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    proc = _run(["--cpu", "tests"], out, timeout=120, SAGE_GPU_PYTHON=str(fake), SAGE_GPU_BUDGET_TESTS="16")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _summary(out) == [("tests", "device_tier", "124"), ("tests", "unit_tier_cpu", "skipped")]
    assert "(timed out)" in (out / "tests.log").read_text()
    (pid,) = [int(line) for line in pids.read_text().split()]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

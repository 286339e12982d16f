"""The GPU session runner end to end on the CPU: a check part runs, a hanging command is killed and the session
goes on."""
import os
from pathlib import Path

import pytest
import torch

from gpu_session_support import run_session


def _summary(out_dir: Path) -> list:
    """(part, label, exit status) of each line of summary.tsv."""
    return [tuple(line.split("\t")[:3]) for line in (out_dir / "summary.tsv").read_text().splitlines()]


def test_check_part_runs_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    proc = run_session(["--cpu", "check"], out, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _summary(out) == [("check", "gpu_check", "0")]
    log = (out / "check.log").read_text()
    assert "check: OK" in log and "tiny pass on cpu torch.float32" in log
    imported = next(line for line in log.splitlines() if line.startswith("imported "))
    done, total = imported.split()[1], imported.split()[3]
    assert done == total and int(total) > 50, imported  # every sage_grpo module
    assert f"torch {torch.__version__}" in (out / "env.txt").read_text()


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
    proc = run_session(["--cpu", "tests"], out, timeout=120, SAGE_GPU_PYTHON=str(fake), SAGE_GPU_BUDGET_TESTS="16")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _summary(out) == [("tests", "device_tier", "124"), ("tests", "unit_tier_cpu", "skipped")]
    assert "(timed out)" in (out / "tests.log").read_text()
    (pid,) = [int(line) for line in pids.read_text().split()]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

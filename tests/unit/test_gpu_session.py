"""scripts/gpu_session.sh, the GPU runbook's runner, on the CPU: its `check` part end to end, its time limits, and
the refusals that keep a GPU session from spending device minutes on a typo (docs/gpu_runbook.md)."""
import pytest

from procs import run_group
from gpu_session_support import REPO_ROOT, run_session


@pytest.mark.parametrize("args, message", [
    ([], "usage: bash scripts/gpu_session.sh"),
    (["bogus"], "unknown part 'bogus': use check, tests, kernels, step, generate, extra or all"),
    (["--cpu", "check", "kernels"], "part kernels times the real-width model and needs a GPU"),
])
def test_runner_refuses_bad_parts_before_doing_anything(tmp_path, args, message):
    out = tmp_path / "out"
    proc = run_session(args, out, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr
    assert not out.exists()  # nothing installed, described or run


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout (the device machine's copy)")
def test_carried_wheels_and_runner_output_stay_out_of_git():
    proc = run_group(["git", "check-ignore", ".whl/diffusers-0.42.1-py3-none-any.whl", "gpu_out/check.log"],
                     cwd=REPO_ROOT, timeout=30)
    assert proc.returncode == 0 and len(proc.stdout.split()) == 2, proc.stdout + proc.stderr

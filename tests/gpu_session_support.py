"""Helpers shared by unit/test_gpu_session.py and e2e/test_gpu_session_runs.py."""
import os
import subprocess
import sys
from pathlib import Path

from procs import run_group


REPO_ROOT = Path(__file__).resolve().parents[1]
RUNNER = ["bash", str(REPO_ROOT / "scripts" / "gpu_session.sh")]


def run_session(args, out_dir: Path, timeout: float, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OUT": str(out_dir), "SAGE_GPU_PYTHON": sys.executable, **env}
    return run_group(RUNNER + list(args), cwd=REPO_ROOT, env=environ, timeout=timeout)

"""slurm_train.sbatch end to end on one machine: fake srun/scontrol (tests/slurm_support.py) make a one-node job, the
script's own launch logic starts torchrun with 2 CPU processes through the c10d rendezvous and the tiny run trains 2
steps. The secret in the environment reaches the node but no command line. The run's console is a piped log: it is
the test of one line per event and no progress-bar fragments."""

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from model_fixtures import tiny_args
from procs import run_group
from slurm_support import install_shims, slurm_env

pytestmark = pytest.mark.distributed

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_slurm_launch_trains_two_steps_on_two_processes(tiny_root, tmp_path):
    run_dir = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = slurm_env(dict(os.environ), install_shims(tmp_path / "bin"), ["127.0.0.1"], 2,
                    SLURM_SUBMIT_DIR=str(REPO_ROOT), OUTPUT_DIR=str(run_dir), MASTER_PORT=str(_free_port()),
                    TORCHRUN=str(torchrun), HF_TOKEN="secret-789", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                    FAKE_SRUN_ARGV=str(tmp_path / "srun_argv"), FAKE_SRUN_ENV=str(tmp_path / "srun_env"))
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    # the reference's flags first (as on a cluster), the tiny CPU run's after them (later flags win)
    flags = tiny_args(tiny_root, run_dir, "--max_steps", "2", "--reference_mode_offload", "false")
    proc = run_group(["bash", str(REPO_ROOT / "scripts/post_train/slurm_train.sbatch"), *flags], env=env,
                     cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert proc.stdout.count("training finished at step 2") == 1  # rank 0's console, through the node's tee
    assert "training finished at step 2" in (run_dir / "logs" / "node_0.log").read_text()
    # the log is piped (no terminal): one line per event, no progress bar's carriage returns joined to a line
    assert "\r" not in proc.stdout + proc.stderr and "denoising" not in proc.stderr and "GRPO:" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.endswith("] run summary:") for line in lines) == 1
    assert any(line.endswith("  world          2 process(es) = dp 2 x sp 1 on cpu") for line in lines)
    step_lines = [line for line in lines if "] step " in line]
    assert len(step_lines) == 2 and all(line.startswith("[") for line in step_lines)
    assert step_lines[0].split("] ", 1)[1].startswith("step 1 | reward ") and step_lines[1].endswith("| eta 0s")
    argv = (tmp_path / "srun_argv").read_text().split("\0")
    assert argv[:4] == ["--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--export=ALL"]
    assert "secret-789" not in " ".join(argv)
    assert (tmp_path / "srun_env").read_text() == "HF_TOKEN=secret-789\n"  # inherited by the node's tasks

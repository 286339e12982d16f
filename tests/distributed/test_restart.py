"""Runs that survive a lost worker, workers that die with their agent, and a hung peer named in bounded time,
on 2 CPU processes (gloo on 127.0.0.1) in their own process groups (tests/procs.py).

- a worker is SIGKILLed mid-run under ``torchrun --max-restarts 1``; the restarted group resumes from the latest
  checkpoint by itself (``--resume_from_checkpoint auto``) and the finished run's metrics equal an uninterrupted
  run's, bit for bit (same layout, same RNG states restored);
- kill -9 of the torchrun agent: its workers exit within seconds (parent-death signal), not train on under PID 1;
- a rank that SIGSTOPs itself mid-step: the other ends within twice ``--collective_timeout_minutes``, naming it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_fixtures import tiny_checkpoint
from procs import kill_group, run_group, running, scaled, start_group

from sage_grpo.faults import FAULT_ENV
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "tests" / "distributed" / "scripts"
MAX_STEPS = 2


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop(FAULT_ENV, None)
    env.update(extra)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _torchrun(*args: str, restarts: int = 0) -> list:
    """As scripts/post_train/train_grpo.sh launches (torchrun's static rendezvous, one store kept across restarts)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(_free_port()), "--max-restarts", str(restarts), "--monitor-interval", "0.2", *args]


def _train_flags(root: Path, run_dir: Path) -> list:
    """configs/tiny_cpu.yaml at its smallest: 5 frames of 16x16, 2 SDE steps, dp 2 x batch 2, a checkpoint every
    step, FSDP off (the restart path is the same with it; the FSDP runs are in test_distributed_trainer.py)."""
    return ["post_train.py", "--config", str(REPO_ROOT / "configs" / "tiny_cpu.yaml"), "--pretrained_model_root",
            str(root), "--output_dir", str(run_dir), "--train_video_csv", str(REPO_ROOT / "assets" / "demo_train.csv"),
            "--grpo_sampling_steps", "2", "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16",
            "--text_max_length", "16", "--byt5_max_length", "8", "--validation_interval", "0", "--max_steps",
            str(MAX_STEPS), "--save_interval", "1", "--batch_size", "2", "--enable_fsdp", "false", "--use_muon",
            "false", "--report_to", "none", "--save_rollout_videos", "false", "--resume_from_checkpoint", "auto"]


def _comparable(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in rows]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


def test_a_run_survives_a_lost_worker_and_ends_with_the_uninterrupted_metrics(root, tmp_path):
    straight_dir, restarted_dir = tmp_path / "straight", tmp_path / "restarted"
    straight = run_group(_torchrun(*_train_flags(root, straight_dir)), cwd=REPO_ROOT, env=_env(), timeout=300)
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-4000:]

    start = time.monotonic()
    # rank 1 dies by SIGKILL after the first backward of step 2 (checkpoint-1 exists), on the first attempt only
    restarted = run_group(_torchrun(*_train_flags(root, restarted_dir), restarts=1), cwd=REPO_ROOT,
                          env=_env(**{FAULT_ENV: f"update:{MAX_STEPS}@1"}), timeout=300)
    elapsed = time.monotonic() - start
    output = restarted.stdout + restarted.stderr
    assert restarted.returncode == 0, output[-4000:]
    assert "Signals.SIGKILL" in output or "exitcode: -9" in output, output[-4000:]  # the agent saw the lost worker
    assert f"resumed from {restarted_dir / 'checkpoint-1'} at step 1" in output
    assert output.count(f"training finished at step {MAX_STEPS}") == 1
    assert _comparable(read_metrics(restarted_dir)) == _comparable(read_metrics(straight_dir))
    assert [row["step"] for row in read_metrics(restarted_dir)] == [1, 2]
    print(f"lost worker -> restart -> finished in {elapsed:.1f} s (busy shared machine)")


def test_workers_exit_when_the_torchrun_agent_is_killed(tmp_path):
    agent = start_group(_torchrun(str(SCRIPTS / "orphan_check.py"), str(tmp_path)), cwd=REPO_ROOT, env=_env(),
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers = []
    try:
        pid_files = [tmp_path / f"rank{rank}.pid" for rank in (0, 1)]

        def written() -> bool:  # a worker's write_text creates the file empty, then fills it
            return all(p.exists() and p.read_text().strip().isdigit() for p in pid_files)

        deadline = time.monotonic() + scaled(120.0)
        while not written() and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.1)
        assert written(), agent.stderr.read().decode()[-3000:] if agent.poll() else "slow"
        workers = [int(p.read_text()) for p in pid_files]
        os.kill(agent.pid, signal.SIGKILL)  # the agent only: nobody signals its workers
        killed = time.monotonic()
        deadline = killed + scaled(10.0)
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(running(pid) for pid in workers), "workers outlived their agent"
        print(f"workers gone {time.monotonic() - killed:.2f} s after the agent's SIGKILL")
    finally:
        kill_group(agent)
        for pid in workers:  # torchrun starts each worker in a session of its own: the agent's group misses them
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_stopped_peer_is_named_within_the_collective_timeout():
    timeout_minutes = 0.05  # 3 s: a roll call after the failed collective makes at most 6 s
    port = _free_port()
    procs = [start_group([sys.executable, str(SCRIPTS / "hung_peer.py"), str(timeout_minutes)], cwd=REPO_ROOT,
                         env=_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=str(port)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        _, stderr = procs[0].communicate(timeout=scaled(120.0))
        assert procs[0].returncode == 3, stderr[-3000:]
        line = next(line for line in stderr.splitlines() if "PeerLost" in line)
        seconds = float(line.split("PeerLost after ")[1].split(" s")[0])
        assert "rank 1 did not answer within 0.05 min (--collective_timeout_minutes)" in line
        assert 2.5 < seconds < 2 * 60 * timeout_minutes + scaled(3.0), seconds
        print(f"stopped peer named after {seconds:.1f} s")
    finally:
        for proc in procs:
            kill_group(proc)

"""python -m sage_grpo.evaluate under torchrun (2 processes, gloo, CPU): prompts split over the ranks give the same
results.json scores as one process (3 checkpoints x 4 prompts x 2 seeds, 2 sampling steps, tiny checkpoint)."""

import json
import os
import socket
import sys
from pathlib import Path

import torch
from eval_support import PROMPTS, make_eval_setup, scores_only
from procs import run_group, scaled

from sage_grpo.evaluate import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_equal_one(tiny_root, tiny_reward_root, tmp_path):
    setup = make_eval_setup(tiny_root, tiny_reward_root, tmp_path / "setup")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: see tests/e2e/test_evaluate.py
    try:
        assert main([*setup["args"], "--output", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(before)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "sage_grpo.evaluate", *setup["args"],
           "--output", str(tmp_path / "two")]
    proc = run_group(cmd, cwd=REPO_ROOT, env=env, timeout=scaled(300))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert scores_only(two) == scores_only(one)
    records = [json.loads(path.read_text()) for path in (tmp_path / "two" / "cache").rglob("*_seed*.json")]
    assert len(records) == 24  # every unit sampled once, prompt i by rank i mod 2
    row_of = {prompt: row for row, prompt in enumerate(PROMPTS)}  # the cache names a unit by its prompt's text
    assert all(record["rank"] == row_of[record["prompt"]] % 2 for record in records)
    assert len(list((tmp_path / "two" / "side_by_side").glob("*.png"))) == 4

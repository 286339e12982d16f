"""End to end: ``post_train.py --remote_reward_url`` with no server there ends at start in one line
naming the URL and what to check (the client's probe waits 5 s, not 4 x 600 s), without a traceback."""

import os
import socket
import sys
from pathlib import Path

from model_fixtures import tiny_args
from procs import run_group

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_post_train_with_an_unreachable_reward_server_ends_in_one_line(tiny_root, tmp_path):
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % closed.getsockname()[1]
    proc = run_group([sys.executable, "post_train.py", *tiny_args(tiny_root, tmp_path / "run", "--max_steps", "1",
                                                                  "--remote_reward_url", url)],
                     cwd=REPO_ROOT, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last.startswith(f"error: the reward server at {url} did not answer GET /info within 5 s"), last

"""torchrun's environment is checked before any connection, and a rank whose peers never join stops after a bounded
wait (--collective_timeout_minutes) with one line naming the missing rank and where it waited. In-process with
monkeypatched variables; one subprocess shows the command's whole output for a rank whose rank 0 never comes."""

import re
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from model_fixtures import tiny_args
from procs import run_group

import sage_grpo.distributed.parallel_dims as parallel_dims
import sage_grpo.startup.build as startup_build
from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError
from sage_grpo.config.launch_env import read_launch_env

REPO_ROOT = Path(__file__).resolve().parents[2]
VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def launch(monkeypatch):
    """Set torchrun's variables for this test only (every other one unset)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(parallel_dims, "install_parent_death_signal", lambda: True)  # not on the test process
    monkeypatch.setattr(startup_build, "build_models", lambda *a: pytest.fail("models loaded"))

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))
    return set_env


@pytest.mark.parametrize("env,connecting,match", [
    (dict(WORLD_SIZE="abc"), False, r"WORLD_SIZE='abc' is not a non-negative integer\. Fix: launch with torchrun"),
    (dict(WORLD_SIZE="0"), False, r"WORLD_SIZE=0: a launch has at least one process"),
    (dict(RANK="3", WORLD_SIZE="2"), False, r"RANK=3 is outside WORLD_SIZE=2 \(ranks 0 to 1\)\. Fix: .* set RANK to "
                                            r"one of 0\.\.1"),
    (dict(RANK="1"), False, r"RANK=1 is outside WORLD_SIZE=1"),
    (dict(LOCAL_RANK="-1"), False, r"LOCAL_RANK='-1' is not a non-negative integer"),
    (dict(WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", LOCAL_RANK="2"), False, r"LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2"),
    (dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="4"), False, r"LOCAL_WORLD_SIZE=4 must be in \[1, WORLD_SIZE=2\]"),
    (dict(WORLD_SIZE="2"), True, r"WORLD_SIZE=2 but MASTER_ADDR is not set.* MASTER_ADDR=<rank 0's host> "
                                 r"MASTER_PORT=29500"),
    (dict(WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="70000"), True, r"needs MASTER_PORT, a port in 1\.\.65535 "
                                                                       r"\(got '70000'\)"),
    (dict(WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="x"), True, r"MASTER_PORT='x' is not a non-negative integer"),
])
def test_a_bad_variable_is_one_line_naming_it(env, connecting, match):
    with pytest.raises(ConfigError) as refused:
        read_launch_env(env, connecting=connecting)
    message = str(refused.value)
    assert message.startswith("[launch-env] ") and "\n" not in message and re.search(match, message), message


def test_a_good_launch_reads_as_given():
    env = dict(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", MASTER_ADDR="n0", MASTER_PORT="29500")
    launch = read_launch_env(env, connecting=True)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size, launch.address) == (
        5, 8, 1, 4, "n0:29500")
    assert read_launch_env({}) == read_launch_env({"WORLD_SIZE": "1", "RANK": "0"})  # one process
    assert read_launch_env({"WORLD_SIZE": "2"}).world_size == 2  # the memory plan needs no address


@pytest.mark.parametrize("env,match", [
    (dict(WORLD_SIZE="abc"), r"WORLD_SIZE='abc' is not a non-negative integer"),
    (dict(RANK="3", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"), r"RANK=3 is outside WORLD_SIZE=2"),
    (dict(WORLD_SIZE="2"), r"WORLD_SIZE=2 but MASTER_ADDR is not set"),
    (dict(LOCAL_RANK="x"), r"LOCAL_RANK='x' is not a non-negative integer"),
])
def test_post_train_refuses_before_any_connection(tiny_root, tmp_path, capsys, launch, monkeypatch, env, match):
    """RANK=3 WORLD_SIZE=2 waited for its peers before its rank was compared with the world."""
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: pytest.fail("connected"))
    launch(**env)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(tiny_root, tmp_path / "run"))
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and len(err.splitlines()) == 1 and re.search(match, err), err
    assert time.perf_counter() - start < 30 and not dist.is_initialized()


@pytest.mark.parametrize("rank,expected", [
    (0, "rank 0 waited 0.02 min (--collective_timeout_minutes) at MASTER_ADDR:MASTER_PORT 127.0.0.1:{port} for the 2 "
        "ranks of WORLD_SIZE=2: rank 1 never joined. Fix: start every rank (torchrun --nproc_per_node 2 post_train.py "
        "... on each node starts them together), or unset WORLD_SIZE to run one process"),
    (1, "rank 1 waited 0.02 min (--collective_timeout_minutes) for the job's store at MASTER_ADDR:MASTER_PORT "
        "127.0.0.1:{port}, which rank 0 holds, and it never answered: rank 0 is missing or that address is not rank "
        "0's. Fix: start rank 0 (torchrun --nproc_per_node 2 post_train.py ... starts every rank), or set MASTER_ADDR "
        "and MASTER_PORT to rank 0's on every rank"),
])
def test_a_missing_peer_is_named_after_the_collective_timeout(tiny_root, tmp_path, capsys, launch, rank, expected):
    """WORLD_SIZE=2 without its peer waited 30 minutes inside torch, then ended in a traceback."""
    port = free_port()
    launch(RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(tiny_root, tmp_path / "run", "--collective_timeout_minutes", "0.02"))
    waited = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and err == "error: " + expected.format(port=port), err
    assert 1.2 <= waited < 60 and not dist.is_initialized() and not (tmp_path / "run").exists()


def test_two_ranks_that_meet_pass_the_roll_call(launch):
    """Both ranks of one job in two threads of this process: the store, the roll call, then the keys are found."""
    import threading
    from datetime import timedelta

    from sage_grpo.config.launch_env import LaunchEnv
    from sage_grpo.distributed.join import join_store

    port, stores = free_port(), {}

    def join(rank):  # each store kept (rank 0's serves the job, as its process group keeps it)
        stores[rank] = join_store(LaunchEnv(rank, 2, rank, 2, "127.0.0.1", port), timedelta(seconds=20))
    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(stores) == [0, 1]
    assert all(store.check(["sage_grpo/join/0", "sage_grpo/join/1"]) for store in stores.values())


def test_a_local_rank_without_its_gpu_is_refused(launch, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda *a: pytest.fail("set a GPU that is not there"))
    launch(LOCAL_RANK=2, LOCAL_WORLD_SIZE=4, WORLD_SIZE=4, RANK=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=2 but this node has 2 visible GPU\(s\)\. Fix: torchrun "
                                          r"--nproc_per_node 2"):
        parallel_dims.init_distributed()


def test_the_evaluation_checks_them_too(tmp_path, capsys, launch):
    from sage_grpo.evaluate import main as evaluate_main

    launch(WORLD_SIZE="two")
    prompts = tmp_path / "eval.csv"
    prompts.write_text("prompt\nA cat walks\n")
    assert evaluate_main(["--checkpoints", "base", "--prompts", str(prompts), "--model_path", str(tmp_path)]) == 2
    assert "[launch-env] WORLD_SIZE='two' is not a non-negative integer" in capsys.readouterr().err


def test_a_rank_whose_rank_0_never_comes_ends_in_one_line(tmp_path):
    """A process of its own, so its whole stderr is seen: torch's own client logged pages of C++ frames before its
    traceback. (post_train.py prints the same error line: the in-process tests above.)"""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "CUDA_VISIBLE_DEVICES": ""}
    code = ("import sys\nfrom datetime import timedelta\nfrom sage_grpo.distributed.liveness import PeerLost\n"
            "from sage_grpo.distributed.parallel_dims import init_distributed\ntry:\n"
            "    init_distributed(timeout=timedelta(seconds=1.2))\nexcept PeerLost as err:\n"
            "    print(f'error: {err}', file=sys.stderr)\n    sys.exit(2)\n")
    start = time.perf_counter()
    done = run_group([sys.executable, "-W", "ignore", "-c", code], cwd=REPO_ROOT, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: rank 1 waited 0.02 min (--collective_timeout_minutes) for the job's store at MASTER_ADDR:MASTER_PORT "
        f"127.0.0.1:{env['MASTER_PORT']}, which rank 0 holds, and it never answered: rank 0 is missing or that "
        "address is not rank 0's. Fix: start rank 0 (torchrun --nproc_per_node 1 post_train.py ... starts every "
        "rank), or set MASTER_ADDR and MASTER_PORT to rank 0's on every rank"]
    assert time.perf_counter() - start < 60

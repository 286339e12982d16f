"""Fault injection: ``post_train.py`` killed with SIGKILL in each phase of a step, then resumed with
``--resume_from_checkpoint latest``, ends bit-identical to a run that was never interrupted (every logged metric but
the timings, and every tensor of the final checkpoint: weights, moving anchor, optimizer state, counters).

The kill points (``sage_grpo/faults.py``): after the rollout, after the first backward of the update, inside the
checkpoint write (files in the temporary directory, not yet renamed) and halfway through the ``metrics.jsonl``
line, reached by one run in turn: each process is killed at its point and the next one resumes it. Each run is a
subprocess in its own process group (``procs.run_group``).
"""

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from model_fixtures import tiny_args
from procs import run_group
from safetensors.torch import load_file

from sage_grpo.faults import FAULT_ENV
from sage_grpo.safe_io import load_plain
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics


REPO_ROOT = Path(__file__).resolve().parents[2]
TIMING_KEYS = set(TIMING_METRICS)
MAX_STEPS = 3


def post_train(root, run_dir, *extra, fault=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
    # a checkpoint after every step, so that every kill has an earlier checkpoint to resume from
    args = tiny_args(root, run_dir, "--max_steps", str(MAX_STEPS), "--save_interval", "1", *extra)
    return run_group([sys.executable, "post_train.py", *args], cwd=REPO_ROOT, env=env, timeout=300)


def final_state(run_dir):
    checkpoint = run_dir / f"checkpoint-{MAX_STEPS}"
    state = {"model": load_file(checkpoint / "transformer" / "model.safetensors")}
    if (checkpoint / "anchor").is_dir():
        state["anchor"] = load_file(checkpoint / "anchor" / "model.safetensors")
    state["optimizer"] = load_plain(checkpoint / "optimizer.pt", "optimizer state")
    training = load_plain(checkpoint / "training_state.pt", "training state")
    state["training"] = {k: v for k, v in training.items() if k != "rng"}
    return state


def assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def comparable(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


@pytest.fixture(scope="module")
def straight_dir(tiny_root, tmp_path_factory):
    """The uninterrupted run's directory (a checkpoint after each of its 3 steps); tests copy it, never change it."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = post_train(tiny_root, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def straight(straight_dir):
    return read_metrics(straight_dir), final_state(straight_dir)


# The kills in the order one run reaches them: each process is killed at its point and the next one resumes from the
# latest checkpoint (and is killed at the next point), so 5 processes check 4 kill-and-resumes instead of 8.
FAULTS = ("update:2", "checkpoint:2", "rollout:3", "metrics:3")


@pytest.fixture(scope="module")
def chain(tiny_root, tmp_path_factory):
    """For each fault: the killed process's return code and what it left on disk; then the last resume's result."""
    run_dir = tmp_path_factory.mktemp("chain") / "run"
    kills, resume = {}, ()
    for fault in FAULTS:
        proc = post_train(tiny_root, run_dir, *resume, fault=fault)
        step = fault.split(":")[1]
        metrics = run_dir / "metrics.jsonl"
        kills[fault] = dict(returncode=proc.returncode, stderr=proc.stderr[-3000:],
                            partial_checkpoint=(run_dir / f".checkpoint-{step}.tmp").is_dir(),
                            checkpoint=(run_dir / f"checkpoint-{step}").exists(),
                            torn_metrics=metrics.exists() and not metrics.read_text().endswith("\n"))
        resume = ("--resume_from_checkpoint", "latest")
    resumed = post_train(tiny_root, run_dir, *resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # each killed run left its lock (a dead pid on this host): the next start took it over and said so
    assert f"took over the lock of --output_dir {run_dir}" in (run_dir / "train.log").read_text()
    assert not (run_dir / "run.lock").exists()  # given back at the end
    return kills, read_metrics(run_dir), final_state(run_dir)


@pytest.mark.parametrize("fault", ["rollout:3", "update:2", "checkpoint:2", "metrics:3"])
def test_kill_9_then_resume_matches_the_uninterrupted_run(straight, chain, fault):
    kills, resumed_rows, resumed_state = chain
    killed = kills[fault]
    assert killed["returncode"] == -signal.SIGKILL, killed["stderr"]
    point = fault.split(":")[0]
    if point == "checkpoint":  # the half-written checkpoint is never mistaken for a finished one
        assert killed["partial_checkpoint"] and not killed["checkpoint"]
    if point == "metrics":
        assert killed["torn_metrics"]  # a torn last line

    rows, state = straight
    assert comparable(resumed_rows) == comparable(rows)
    assert_same(resumed_state, state)
    assert "anchor" in state  # the moving anchor moved (update 2) and is part of what must match


def test_a_user_error_prints_one_line_without_a_traceback(tiny_root, tmp_path):
    proc = post_train(tiny_root, tmp_path / "run", "--resume_from_checkpoint", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --resume_from_checkpoint")
    assert "Traceback" not in proc.stderr


def test_an_older_checkpoint_starts_a_new_branch_and_a_full_disk_loses_nothing(straight, straight_dir, tiny_root,
                                                                               tmp_path, monkeypatch, capsys):
    """A researcher backs up to checkpoint-1 of a 3-step run (with --keep_checkpoints 1), the next resume meets a
    full disk in the checkpoint write, the one after ends the run: the new branch is what `latest` and the pruning
    see, the abandoned one is kept aside whole, and the end is bit-identical to the uninterrupted run. In-process
    (``post_train``'s entry point), one step per start."""
    from safetensors import SafetensorError

    import sage_grpo.checkpoint.files as checkpoint_files
    from sage_grpo.checkpoint import list_checkpoints
    from sage_grpo.cli.train import main

    run = tmp_path / "run"
    shutil.copytree(straight_dir, run)

    def start(*extra):
        return main(tiny_args(tiny_root, run, "--save_interval", "1", "--cpu_threads", "1", *extra))

    assert start("--max_steps", "2", "--keep_checkpoints", "1", "--resume_from_checkpoint",
                 str(run / "checkpoint-1")) == 0
    assert list(list_checkpoints(run)) == [2]  # the new branch's checkpoint, not the abandoned checkpoint-3
    (aside,) = (run / "abandoned").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-2", "checkpoint-3", "metrics.jsonl"]
    assert [row["step"] for row in read_metrics(aside)] == [2, 3]
    assert [row["step"] for row in read_metrics(run)] == [1, 2]
    assert f"is moved to {aside}" in (run / "train.log").read_text()
    branch = {p: p.read_bytes() for p in (run / "checkpoint-2").rglob("*") if p.is_file()}

    def full(*args, **kwargs):  # what safetensors raises on a full disk
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint_files, "save_file", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        start("--max_steps", "3", "--resume_from_checkpoint", "latest")
    err = capsys.readouterr().err  # above the error line: the weight loaders' progress
    line = err.strip().splitlines()[-1]
    assert ended.value.code == 2 and "Traceback" not in err and line.startswith("error: "), err[-3000:]
    assert line.startswith(f"error: [Errno 28] disk full while writing {run / '.checkpoint-3.tmp'}/transformer/"
                           "model.safetensors: it needs about ") and "checkpoint-3 was not written" in line
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name or p.name == "run.lock") == ["checkpoint-2"]
    assert {p: p.read_bytes() for p in (run / "checkpoint-2").rglob("*") if p.is_file()} == branch
    monkeypatch.undo()

    assert start("--max_steps", "3", "--resume_from_checkpoint", "latest") == 0
    rows, state = straight
    assert comparable(read_metrics(run)) == comparable(rows)  # steps 1, 2, 3 of one branch
    assert_same(final_state(run), state)

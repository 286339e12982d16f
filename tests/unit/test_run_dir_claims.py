"""The run directory belongs to one run, keeps what the run reads, and loses no branch: the lock
(sage_grpo/tracking/run_lock.py), the checks of a start (run_claim.py), the move of an abandoned branch (branches.py),
pruning, a full disk during a checkpoint, and an --output_dir that cannot be written.

Through ``post_train``'s entry point in-process where a user meets it (each refused before any model loads); the
lock's staleness rules and the branch move on files made here. The whole-loop branch, full-disk and exact-resume
chain is in tests/e2e/test_faults.py.
"""

import errno
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from model_fixtures import tiny_args
from procs import kill_group, run_group, start_group
from trust_support import one_error_line as _one_error_line
from trust_support import snapshot as _snapshot
from safetensors import SafetensorError

import sage_grpo.checkpoint.files as checkpoint_files
import sage_grpo.tracking.run_lock as run_lock
import sage_grpo.startup.build as startup_build
from sage_grpo.checkpoint import CheckpointManager, list_checkpoints, prune_checkpoints
from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.distributed import ParallelDims
from sage_grpo.rl import MovingAnchorSchedule
from sage_grpo.safe_io import DiskFullError
from sage_grpo.tracking.branches import move_branch_aside
from sage_grpo.tracking.run_claim import RunDirPlan, check_writable, config_inputs
from sage_grpo.tracking.run_dir import read_metrics
from sage_grpo.tracking.run_lock import LOCK_FILE, acquire_run_lock, release_run_locks, this_process

# what safetensors' Rust writer raises on a full disk (seen on a 64 KiB tmpfs): not an OSError
SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda *args: pytest.fail("models loaded although the start must be refused"))


@pytest.fixture(autouse=True)
def _no_lock_kept():
    yield
    release_run_locks()


@pytest.fixture
def earlier_run(tmp_path) -> Path:
    """A finished run's directory: a LoRA adapter in checkpoint-1, the files --overwrite_output_dir deletes."""
    run = tmp_path / "run"
    (run / "checkpoint-1" / "lora").mkdir(parents=True)
    (run / "checkpoint-1" / "lora" / "adapter_model.safetensors").write_bytes(b"adapter")
    (run / "checkpoint-1" / "lora" / "adapter_config.json").write_text("{}")
    (run / "checkpoint-1" / "training_state.pt").write_bytes(b"state")
    for name, text in (("run_config.yaml", "max_steps: 2\n"), ("metrics.jsonl", '{"step": 1}\n'),
                       ("train.log", "step 1\n")):
        (run / name).write_text(text)
    return run


def _start(argv, capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        train_cli.main(argv)
    assert ended.value.code == 2
    return _one_error_line(capsys.readouterr().err)


# ---------------------------------------------------------------- one run at a time

def _lock_of(run: Path, **changes) -> Path:
    """A lock file as a run with ``changes`` to this process's record left it."""
    path = run / LOCK_FILE
    path.write_text(json.dumps({**this_process(), **changes}))
    return path


@pytest.fixture
def live_process():
    proc = start_group([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    kill_group(proc)


def test_overwrite_of_a_directory_another_run_holds_is_refused(tiny_root, earlier_run, live_process, no_models,
                                                               capsys):
    start = run_lock._proc_stat(live_process.pid)[1]
    lock = _lock_of(earlier_run, pid=live_process.pid, process_start=start, started="2026-12-06 10:00:00 +0000")
    before = _snapshot(earlier_run)
    line = _start(tiny_args(tiny_root, earlier_run, "--overwrite_output_dir", "true"), capsys)
    assert line.startswith(f"error: --output_dir {earlier_run} is in use by another run (host {this_process()['host']}"
                           f", pid {live_process.pid}, started 2026-12-06 10:00:00 +0000, last heartbeat "), line
    assert line.endswith(f"delete {lock}"), line
    assert _snapshot(earlier_run) == before  # nothing deleted, the holder's lock included


def test_a_lock_left_by_a_killed_run_on_this_host_is_taken_over_with_a_line(tmp_path):
    gone = start_group([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    _lock_of(tmp_path, pid=gone.pid, started="2026-12-06 10:00:00 +0000")
    notes = []
    lock = acquire_run_lock(tmp_path, notes.append)
    assert notes == [f"took over the lock of --output_dir {tmp_path.resolve()} from a run that is gone (host "
                     f"{this_process()['host']}, pid {gone.pid}, started 2026-12-06 10:00:00 +0000: its process "
                     f"{gone.pid} is gone)"]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.record["token"]
    release_run_locks()
    assert not (tmp_path / LOCK_FILE).exists() and sorted(os.listdir(tmp_path)) == []  # no temporary file left


def test_a_reused_pid_is_not_the_holder(tmp_path, live_process):
    """The holder's pid runs, but it is another process (its start time since boot differs)."""
    start = run_lock._proc_stat(live_process.pid)[1]
    _lock_of(tmp_path, pid=live_process.pid, process_start=start + 1)
    notes = []
    acquire_run_lock(tmp_path, notes.append)
    assert notes and notes[0].endswith(f"pid {live_process.pid} is another process now)")


def test_another_host_holds_the_lock_until_its_heartbeat_stops(tmp_path):
    path = _lock_of(tmp_path, host="other-node", pid=4242, started="2026-12-06 10:00:00 +0000")
    with pytest.raises(ConfigError, match=r"in use by another run \(host other-node, pid 4242, started 2026-12-06 "
                                          r"10:00:00 \+0000, last heartbeat 0 s ago\)"):
        acquire_run_lock(tmp_path)
    quiet = time.time() - run_lock.STALE_AFTER_SECONDS - 5
    os.utime(path, (quiet, quiet))
    notes = []
    acquire_run_lock(tmp_path, notes.append)
    assert notes and notes[0].endswith(f"no heartbeat from other-node for {run_lock.STALE_AFTER_SECONDS + 5:.0f} s)")


def test_a_requeued_slurm_job_takes_over_its_earlier_attempt_at_once(tmp_path, monkeypatch):
    """A requeue may land on another node: the earlier attempt's heartbeat is fresh, but Slurm runs one attempt of a
    job at a time."""
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _lock_of(tmp_path, host="other-node", pid=4242, slurm_job="777", slurm_restart=1)
    with pytest.raises(ConfigError, match="in use by another run"):  # the same attempt: not provably gone
        acquire_run_lock(tmp_path)
    _lock_of(tmp_path, host="other-node", pid=4242, slurm_job="777", slurm_restart=0)
    notes = []
    acquire_run_lock(tmp_path, notes.append)
    assert notes and notes[0].endswith("an earlier attempt of Slurm job 777 (restart 0; this is 1))")


def test_the_heartbeat_and_the_release_touch_only_this_runs_lock(tmp_path):
    lock = acquire_run_lock(tmp_path)
    assert acquire_run_lock(tmp_path) is lock  # taken again by the same process: the same lock
    old = time.time() - 100
    os.utime(lock.path, (old, old))
    assert lock.beat() and time.time() - lock.path.stat().st_mtime < 50
    other = _lock_of(tmp_path, host="other-node", pid=4242)  # deleted by hand, then taken by another run
    with pytest.warns(RuntimeWarning, match="is no longer this run's"):
        assert not lock.beat()
    lock.release()
    assert json.loads(other.read_text())["host"] == "other-node"  # the other run's lock stays


def test_two_starts_cannot_both_take_over_a_stale_lock(tmp_path):
    """The takeover goes through run.lock.takeover, created exclusively; one left behind by a start that died while
    taking over is ignored after a minute."""
    _lock_of(tmp_path, host="other-node", pid=4242)
    quiet = time.time() - run_lock.STALE_AFTER_SECONDS - 5
    os.utime(tmp_path / LOCK_FILE, (quiet, quiet))
    guard = tmp_path / f"{LOCK_FILE}.takeover"
    guard.touch()  # another start is replacing the stale lock right now
    with pytest.raises(ConfigError, match=f"another start is taking over the lock of --output_dir {tmp_path} right "
                                          "now; try again in a minute"):
        acquire_run_lock(tmp_path)
    os.utime(guard, (quiet, quiet))  # that start died a while ago
    lock = acquire_run_lock(tmp_path, [].append)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.record["token"] and not guard.exists()


def test_a_garbled_lock_file_is_one_line(tmp_path):
    (tmp_path / LOCK_FILE).write_text("not json")
    with pytest.raises(ConfigError, match=rf"cannot read the run directory's lock {tmp_path / LOCK_FILE}: .*; if no "
                                          rf"run is using {tmp_path}, delete {tmp_path / LOCK_FILE}"):
        acquire_run_lock(tmp_path)


def test_a_killed_holder_releases_nothing_but_a_clean_exit_does(tmp_path):
    """The lock is given back at interpreter exit (an error, sys.exit); after SIGKILL it stays, and is stale."""
    code = ("import sys; from pathlib import Path; from sage_grpo.tracking.run_lock import acquire_run_lock; "
            f"acquire_run_lock(Path({str(tmp_path)!r})); sys.exit(int(sys.argv[1]))")
    repo = Path(__file__).resolve().parents[2]
    ended = run_group([sys.executable, "-c", code, "3"], cwd=repo, timeout=60)
    assert ended.returncode == 3 and not (tmp_path / LOCK_FILE).exists(), ended.stderr
    killed = run_group([sys.executable, "-c", code.replace("sys.exit(int(sys.argv[1]))", "import os, signal; "
                                                           "os.kill(os.getpid(), signal.SIGKILL)")], cwd=repo, timeout=60)
    assert killed.returncode == -9 and (tmp_path / LOCK_FILE).exists()
    notes = []
    acquire_run_lock(tmp_path, notes.append)
    assert notes and notes[0].endswith("is gone)")


# ---------------------------------------------------------------- an --output_dir the run cannot write

def test_a_dangling_output_dir_link_is_one_line_before_anything_loads(tiny_root, tmp_path, no_models, capsys):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone" / "run")
    line = _start(tiny_args(tiny_root, link), capsys)
    assert line.startswith(f"error: --output_dir {link}: {link} is a symbolic link to {tmp_path / 'gone' / 'run'}, "
                           "which does not exist; create that folder, or pass --output_dir "), line
    assert not (tmp_path / "gone").exists()


def test_a_read_only_output_dir_is_one_line_before_anything_loads(tiny_root, tmp_path, no_models, capsys,
                                                                  monkeypatch):
    read_only = tmp_path / "mnt"
    read_only.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != read_only and real(path, mode))
    line = _start(tiny_args(tiny_root, read_only / "run"), capsys)
    assert line.startswith(f"error: --output_dir {read_only / 'run'}: {read_only} is read-only (a read-only mount, or "
                           "no write permission for this user), so the run could write nothing there; pass "
                           "--output_dir "), line
    alternative = Path(line.rsplit("--output_dir ", 1)[1])
    assert alternative.name == "run" and read_only not in alternative.parents


def test_a_write_refused_when_the_directory_is_taken_is_one_line(tmp_path, monkeypatch):
    """A mount that turns read-only between the check and the start: the lock's first write fails."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    plan = RunDirPlan(tmp_path / "run", False, False, False, 0, {})
    monkeypatch.setattr(run_lock, "_write_record", read_only)
    with pytest.raises(ConfigError, match=rf"--output_dir {tmp_path / 'run'}: cannot write there \(Read-only file "
                                          r"system\); pass --output_dir "):
        plan.take([])


# ---------------------------------------------------------------- nothing a run reads is deleted

def test_overwrite_refuses_to_delete_the_adapter_the_run_starts_from(tiny_root, earlier_run, no_models, capsys):
    adapter = earlier_run / "checkpoint-1" / "lora"
    before = _snapshot(earlier_run)
    line = _start(tiny_args(tiny_root, earlier_run, "--overwrite_output_dir", "true", "--use_lora", "true",
                            "--pretrained_lora_path", str(adapter)), capsys)
    assert line == (f"error: --overwrite_output_dir true would delete {earlier_run / 'checkpoint-1'}, which holds "
                    f"--pretrained_lora_path {adapter}: the run would lose a file it reads. Copy it outside "
                    f"--output_dir {earlier_run} and pass the copy, or choose another --output_dir")
    assert _snapshot(earlier_run) == before


def test_overwrite_refuses_to_delete_its_config_file(tiny_root, earlier_run, no_models, capsys):
    config = earlier_run / "run_config.yaml"  # "python post_train.py --config run_config.yaml repeats the run"
    line = _start(["--config", str(config), *tiny_args(tiny_root, earlier_run, "--overwrite_output_dir", "true")],
                  capsys)
    assert line.startswith(f"error: --overwrite_output_dir true would delete {config}, which is --config {config}:")
    assert config.read_text() == "max_steps: 2\n"


def test_every_option_that_names_a_file_is_an_input(tmp_path):
    """Found by value over every option, JSON-valued ones included: no list of path options to keep up to date."""
    csv, weights, clip = tmp_path / "p.csv", tmp_path / "w.bin", tmp_path / "clip"
    csv.write_text("prompt\na\n")
    weights.write_bytes(b"w")
    clip.mkdir()
    cfg = parse_cli(TrainConfig, ["--output_dir", str(tmp_path), "--valid_video_csv", str(csv),
                                  "--reward_kwargs", json.dumps({"checkpoint": str(weights), "size": [1, 2]}),
                                  "--clip_model", str(clip), "--run_name", "not-a-file"])
    found = config_inputs(cfg, images=[str(tmp_path / "cat.png"), ""])
    assert found[f"--valid_video_csv {csv}"] == csv and found[f"--clip_model {clip}"] == clip
    assert found[f"--reward_kwargs {weights}"] == weights
    assert found[f"the reference image {tmp_path / 'cat.png'}"] == tmp_path / "cat.png"
    assert not any(label.startswith(("--output_dir", "--run_name")) for label in found)


def test_pruning_and_a_branch_move_refuse_to_take_an_input(earlier_run):
    (earlier_run / "checkpoint-2").mkdir()
    adapter = earlier_run / "checkpoint-1" / "lora"
    plan = RunDirPlan(earlier_run, False, True, False, 1, {f"--pretrained_lora_path {adapter}": adapter})
    with pytest.raises(ConfigError, match=rf"--keep_checkpoints 1 would delete {earlier_run / 'checkpoint-1'}, which "
                                          rf"holds --pretrained_lora_path .* or pass --keep_checkpoints 0$"):
        plan.check_inputs_kept()
    resumed = earlier_run / "checkpoint-1"  # the checkpoint resumed from may be pruned once newer ones exist
    RunDirPlan(earlier_run, False, True, False, 1, {f"--resume_from_checkpoint {resumed}": resumed},
               resume_path=resumed, resume_step=1).check_inputs_kept()
    older = earlier_run / "checkpoint-0"
    older.mkdir()
    branch = RunDirPlan(earlier_run, False, True, False, 0, {f"--pretrained_lora_path {adapter}": adapter},
                        resume_path=older, resume_step=0, resume_updates=0)
    with pytest.raises(ConfigError, match=rf"resuming {older} moves the later branch aside, with "
                                          rf"{earlier_run / 'checkpoint-1'}, which holds --pretrained_lora_path"):
        branch.check_inputs_kept()


# ---------------------------------------------------------------- branches are never lost or mixed

def _steps_run(tmp_path) -> Path:
    run = tmp_path / "run"
    for step in (1, 2, 3, 4):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "training_state.pt").write_bytes(b"%d" % step)
    rows = [{"step": s, "loss": s / 10} for s in (1, 2, 3, 4)] + [{"step": 3, "Validation/avg": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name in ("samples/step_000002", "samples/step_000004", "rl_samples/0000001", "rl_samples/0000002",
                 "rl_samples/0000003"):
        (run / name).mkdir(parents=True)
        (run / name / "v.mp4").write_bytes(name.encode())
    return run


def test_a_resume_from_an_older_checkpoint_moves_the_later_branch_aside(tmp_path):
    run = _steps_run(tmp_path)
    everything = _snapshot(run)
    assert move_branch_aside(run, 4, 4, run / "checkpoint-4") is None  # the newest: nothing to move
    line = move_branch_aside(run, 2, 2, run / "checkpoint-2")
    (folder,) = (run / "abandoned").iterdir()
    assert folder.name.endswith("-after-step-2")
    assert line == (f"resuming {run / 'checkpoint-2'} (step 2) in a run directory that had gone on to checkpoint-4: "
                    f"the later branch (checkpoint-3, checkpoint-4, 3 metrics rows, 3 media folders) is moved to "
                    f"{folder}; nothing of it is deleted (resume one of its checkpoints into a new --output_dir to "
                    "continue it)")
    assert list(list_checkpoints(run)) == [1, 2]  # `latest` is the branch being trained
    assert [row["step"] for row in read_metrics(run)] == [1, 2]
    assert [row["step"] for row in read_metrics(folder)] == [3, 4, 3]
    moved = {name.replace(f"abandoned/{folder.name}/", "") for name in _snapshot(run) if name.startswith("abandoned")}
    assert {"checkpoint-3/training_state.pt", "checkpoint-4/training_state.pt", "samples/step_000004/v.mp4",
            "rl_samples/0000002/v.mp4", "rl_samples/0000003/v.mp4"} <= moved
    assert len(_snapshot(run)) == len(everything) + 1  # every file kept, the metrics split in two


def test_pruning_never_deletes_the_branch_being_trained(tmp_path):
    """The reported case: checkpoint-2 of a new branch beside a stale checkpoint-3 of an abandoned one."""
    for step in (1, 2, 3):
        (tmp_path / f"checkpoint-{step}").mkdir()
    prune_checkpoints(tmp_path, keep=1, current=2)
    assert list(list_checkpoints(tmp_path)) == [2, 3]
    prune_checkpoints(tmp_path, keep=1)
    assert list(list_checkpoints(tmp_path)) == [3]


# ---------------------------------------------------------------- a full disk during the checkpoint write

class _Models:
    policy = torch.nn.Linear(2, 2)
    reference = None

    def trainable_state_dict(self):
        return dict(self.policy.state_dict())

    def save_extras(self, directory):
        pass


def _manager(run_dir: Path) -> CheckpointManager:
    counters = SimpleNamespace(state_dict=lambda: {"global_step": 1, "update_steps": 1, "micro_steps": 1})
    return CheckpointManager(
        models=_Models(), optimizer=torch.optim.SGD(_Models.policy.parameters(), lr=0.1), kl_controller=None,
        anchor_schedule=MovingAnchorSchedule(False, 1), counters=counters, dims=ParallelDims(world_size=1),
        run_dir=run_dir, keep_checkpoints=0, layout={}, config_yaml=lambda: "a: 1\n", log=print)


@pytest.mark.parametrize("where", ["safetensors", "lora"])
def test_a_full_disk_in_the_checkpoint_write_is_one_line_and_leaves_the_last_checkpoint(tmp_path, monkeypatch,
                                                                                        where):
    manager = _manager(tmp_path)
    manager.save(1)
    before = _snapshot(tmp_path)

    def full(*args, **kwargs):
        raise SafetensorError(SAFETENSORS_ENOSPC)

    if where == "safetensors":
        monkeypatch.setattr(checkpoint_files, "save_file", full)
    else:  # peft's adapter folder (save_pretrained writes safetensors too)
        monkeypatch.setattr(_Models, "save_extras", full)
    with pytest.raises(DiskFullError) as raised:
        manager.save(2)
    file = "transformer/model.safetensors" if where == "safetensors" else "lora"
    assert str(raised.value).startswith(f"[Errno 28] disk full while writing {tmp_path / '.checkpoint-2.tmp' / file}: "
                                        "it needs about 1.0 MiB and ")
    assert str(raised.value).endswith("(checkpoint-2 was not written and its partial files were removed; the earlier "
                                      "checkpoints are intact)")
    assert _snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["checkpoint-1"]  # no .tmp left

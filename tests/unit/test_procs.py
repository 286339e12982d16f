"""tests/procs.py: a test's subprocess never outlives it (its whole process group is killed on timeout, on an
interrupt and when the leader exits), timeouts scale with SAGE_GRPO_TEST_TIMEOUT_SCALE, the normal path is
``subprocess.run``'s."""

import os
import subprocess
import sys
import time

import pytest
from procs import process_table, run_group, running, scaled

# bash prints its own pid (= the process group id: run_group starts a new session) and a background grandchild's pid;
# the grandchild ignores the signals a dying parent or terminal would send and does not wait for its parent.
SPAWN_GRANDCHILD = 'trap "" HUP TERM INT; sleep 300 & echo $$ $!; sleep 300'


@pytest.fixture(autouse=True)
def unit_scale(monkeypatch):
    monkeypatch.setenv("SAGE_GRPO_TEST_TIMEOUT_SCALE", "1")


def _running_in_group(pgid: int) -> list:
    """Pids of the processes of group ``pgid`` that are not zombies (an orphan's zombie lingers until init reaps it,
    which a container's init may never do; it holds no CPU or memory)."""
    return [pid for pid, state, _parent, group in process_table() if group == pgid and state != "Z"]


def _assert_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered asynchronously to the processes not waited for
    while _running_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _running_in_group(pgid) == []
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        pass  # no member left at all (an init that reaps orphans)


def test_timeout_kills_the_whole_group_grandchild_included():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_group(["bash", "-c", SPAWN_GRANDCHILD], timeout=2.0)  # time for bash to print its pids, under load too
    assert time.monotonic() - start < 5.0
    pgid, grandchild = map(int, caught.value.output.split())  # the output so far travels with the exception
    assert grandchild != pgid
    _assert_group_gone(pgid)


def test_timeout_kills_a_child_in_a_session_of_its_own_that_holds_the_pipes():
    """torchrun starts each worker in a session of its own: killing torchrun's group left a worker's fork running,
    holding the test's pipes, and the test waited on them forever. The processes below the child are killed too."""
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_group(["bash", "-c", "setsid sh -c 'echo $$; exec sleep 300' & sleep 300"], timeout=2.0)
    assert time.monotonic() - start < 10.0
    (escaped,) = map(int, caught.value.output.split())
    deadline = time.monotonic() + 2.0
    while running(escaped) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running(escaped)


def test_a_leader_that_exits_leaves_no_background_child():
    result = run_group(["bash", "-c", 'sleep 300 > /dev/null 2>&1 & echo $$ $!'], timeout=10)
    assert result.returncode == 0
    pgid, _child = map(int, result.stdout.split())
    _assert_group_gone(pgid)


def test_an_interrupt_kills_the_group(monkeypatch):
    started = []

    def interrupted(self, timeout=None):  # what Ctrl-C (or pytest-timeout's exception) does inside communicate()
        started.extend(map(int, self.stdout.readline().split()))  # once the grandchild runs
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_group(["bash", "-c", SPAWN_GRANDCHILD], timeout=30)
    monkeypatch.undo()
    _assert_group_gone(started[0])


def test_the_timeout_scales_with_the_environment(monkeypatch):
    monkeypatch.setenv("SAGE_GRPO_TEST_TIMEOUT_SCALE", "2.5")
    assert scaled(4) == 10.0
    monkeypatch.delenv("SAGE_GRPO_TEST_TIMEOUT_SCALE")
    assert scaled(4) == 4.0
    monkeypatch.setenv("SAGE_GRPO_TEST_TIMEOUT_SCALE", "0.5")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_group(["sleep", "30"], timeout=0.4)
    assert caught.value.timeout == 0.2


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "", "fast"])
def test_a_bad_scale_is_refused(monkeypatch, value):
    monkeypatch.setenv("SAGE_GRPO_TEST_TIMEOUT_SCALE", value)
    with pytest.raises(ValueError, match="SAGE_GRPO_TEST_TIMEOUT_SCALE must be a positive finite number"):
        scaled(1)


def test_the_normal_path_is_subprocess_run(tmp_path):
    code = ("import os, sys; print('out', os.getcwd(), os.environ['PROCS_TEST']); print('err', file=sys.stderr); "
            "sys.exit(3)")
    result = run_group([sys.executable, "-c", code], timeout=30, cwd=tmp_path, env={**os.environ, "PROCS_TEST": "x"})
    assert isinstance(result, subprocess.CompletedProcess)
    assert result.args == [sys.executable, "-c", code]
    assert (result.returncode, result.stdout, result.stderr) == (3, f"out {tmp_path} x\n", "err\n")
    raw = run_group(["printf", "a"], timeout=30, text=False)
    assert (raw.returncode, raw.stdout, raw.stderr) == (0, b"a", b"")

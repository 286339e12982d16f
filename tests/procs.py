"""Subprocesses for tests that can never outlive their test.

Every child starts in a new session (its own process group), so on timeout the whole group is killed, and with it
every process below the child in other groups (torchrun starts each worker in a session of its own): torchrun's
workers, a script's Python and anything they spawned. Without this, a timed-out ``torchrun`` left its workers spinning
at full CPU after the test had failed.

Timeouts scale with the machine: ``scaled(seconds)`` multiplies a timeout tuned on the 2-core CI machine by
``SAGE_GRPO_TEST_TIMEOUT_SCALE`` (default 1; raise it on a slower or loaded machine).
"""

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence


def scaled(seconds: float) -> float:
    """A timeout tuned on the 2-core CI machine, scaled by ``SAGE_GRPO_TEST_TIMEOUT_SCALE``."""
    text = os.environ.get("SAGE_GRPO_TEST_TIMEOUT_SCALE", "1")
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (factor > 0 and math.isfinite(factor)):  # inf would crash communicate() with an OverflowError
        raise ValueError(f"SAGE_GRPO_TEST_TIMEOUT_SCALE must be a positive finite number, got {text!r}")
    return seconds * factor


def eventually(condition: Callable[[], bool], limit: float = 5.0) -> bool:
    """Poll ``condition`` for at most ``scaled(limit)`` seconds: what another thread or process does next (a server's
    handler giving its slot back after the client has its answer) is not instant on a loaded machine."""
    deadline = time.monotonic() + scaled(limit)
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def process_table() -> list:
    """``(pid, state, parent pid, process group)`` of every process in ``/proc`` (empty where there is no ``/proc``);
    a process that exits while it is read is left out."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    table = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            table.append((int(entry), fields[0], int(fields[1]), int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    return table


def running(pid: int) -> bool:
    """``pid`` exists and is neither a zombie nor dead (a zombie's reaper may never come in a container: it holds no
    CPU or memory)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> list:
    """The pids of every live process below ``pid`` (empty where there is none). torchrun starts each worker in a
    session of its own, so killing torchrun's group leaves them (and anything they forked) running."""
    children: dict = {}
    for child, _state, parent, _group in process_table():
        children.setdefault(parent, []).append(child)
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session=True``) and every process below it,
    wherever its group (torchrun's workers, a worker's forks), then reap ``proc``."""
    below = descendants(proc.pid)  # before the kill: an orphan is reparented and no longer found
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _output_after_kill(proc: subprocess.Popen):
    """What ``proc`` wrote, read after :func:`kill_group`; a process that escaped the kill and still holds the pipes
    cannot make the test wait forever."""
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return "", "(output lost: a process that escaped the kill held the pipes)"


def run_group(cmd: Sequence[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a new process group, killed whole on timeout.

    ``timeout`` is scaled by :func:`scaled`. Raises ``subprocess.TimeoutExpired`` (with the output so far) after
    killing the group, as ``subprocess.run`` does after killing only the child."""
    limit = scaled(timeout)
    kwargs.setdefault("text", True)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        stdout, stderr = _output_after_kill(proc)
        raise subprocess.TimeoutExpired(cmd, limit, output=stdout, stderr=stderr) from None
    except BaseException:  # KeyboardInterrupt, pytest's own timeout: never leave the group behind
        kill_group(proc)
        raise
    finally:
        # a group leader that exited can still leave children (torchrun's workers after a crash)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)


def start_group(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """``Popen`` in a new process group, for tests that interact with a running process (kill it with
    :func:`kill_group`)."""
    return subprocess.Popen(list(cmd), start_new_session=True, **kwargs)


__all__: list[str] = ["descendants", "kill_group", "process_table", "run_group", "running", "scaled", "start_group"]

"""A torchrun job that cannot outlive its agent, and a hung peer named within a time the user sets.

* **Lost agent.** A worker asks the kernel for SIGKILL when its parent (the torchrun agent) dies
  (``prctl(PR_SET_PDEATHSIG)``, Linux). Without it, a kill -9 of the agent left the workers training under PID 1,
  holding their GPUs, with nobody left to restart or stop them.
* **Hung peer.** Every collective of the default process group gives up after ``--collective_timeout_minutes``
  (``init_process_group(timeout=...)``; the reference's two hours let a stopped rank freeze the job that long).
  When a collective fails (gloo: a timeout, or a peer's connection closed), :meth:`PeerWatch.guard` calls the roll
  through the job's rendezvous store: every rank that can still run writes its key there and waits, for the same
  timeout, for the others'; the ranks whose keys never come are named. The run then ends with one line naming
  them, at most twice the timeout after the peer stopped answering. On NCCL the watchdog ends the processes after
  the timeout instead (the failed communicator takes the process down before Python sees an error).
"""

import contextlib
import ctypes
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Iterator, Optional

import torch.distributed as dist

from sage_grpo.config.validation import ConfigError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class PeerLost(RuntimeError):
    """A collective failed and the roll call named the ranks that did not answer."""


def install_parent_death_signal() -> bool:
    """SIGKILL this process when its parent exits (Linux; elsewhere a no-op returning False). A parent that is
    already gone (re-parented to init before the call) ends the process at once."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died between getppid and prctl: the signal will never come
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def collective_timeout(minutes: float) -> timedelta:
    """``--collective_timeout_minutes`` as the timeout of every collective."""
    if not 0 < minutes < float("inf"):
        raise ConfigError(f"--collective_timeout_minutes must be a positive number, got {minutes}")
    return timedelta(minutes=minutes)


class PeerWatch:
    """The roll call behind :meth:`guard`. It needs nothing at start: the roll call goes through the job's
    rendezvous store (torchrun's agent holds it; ``MASTER_ADDR:MASTER_PORT``), which a stopped or dead rank cannot
    write to, so every rank that calls it can name the missing ones itself. Without a process group it watches
    nothing."""

    def __init__(self, timeout: timedelta):
        self.timeout = timeout
        self.active = dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1

    @contextlib.contextmanager
    def guard(self, doing: str = "training") -> Iterator[None]:
        """Run the block; if a collective in it fails, find who stopped answering and raise :class:`PeerLost`
        naming them (the original error when every rank answers)."""
        try:
            yield
        except RuntimeError as err:
            if not self.active or not _is_collective_failure(err):
                raise
            message = self.roll_call()
            if message is None:  # everyone answered: the failure was something else
                raise
            raise PeerLost(f"{message} while {doing} (collective failed: {_first_line(err)}). The run stopped "
                           "instead of waiting: check that rank's node (stopped, swapping, lost network); a "
                           "torchrun --max-restarts N run with --resume_from_checkpoint auto restarts from the "
                           "latest checkpoint") from None

    def roll_call(self) -> Optional[str]:
        """None if every rank answers within the timeout, else a sentence naming those that did not. Each rank sets
        its key and polls for the others' (bounded by the timeout, one poll a second at most)."""
        minutes = f"{self.timeout.total_seconds() / 60:g} min (--collective_timeout_minutes)"
        address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        keys = [f"sage_grpo/roll_call/{attempt}/{rank}" for rank in range(self.world_size)]
        deadline = time.monotonic() + self.timeout.total_seconds()
        try:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=self.timeout)
            store.set(keys[self.rank], "here")
            while not store.check(keys) and time.monotonic() < deadline:
                time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
            missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        except (RuntimeError, KeyError, ValueError) as err:  # the store's host (rank 0, or the agent) is gone too
            return f"the rendezvous store at {address} (rank 0 or the agent) did not answer ({_first_line(err)})"
        if not missing:
            return None
        label = "ranks" if len(missing) > 1 else "rank"
        return f"{label} {', '.join(map(str, missing))} did not answer within {minutes}"


def _is_collective_failure(err: RuntimeError) -> bool:
    text = str(err)
    return isinstance(err, dist.DistError) or "gloo" in text or "Timed out" in text or "Connection closed" in text


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:300]

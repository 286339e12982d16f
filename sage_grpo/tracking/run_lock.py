"""One run at a time in a run directory: the lock file ``<output_dir>/run.lock``.

The run's writing process (rank 0) takes the lock before it writes or deletes anything in the directory and gives it
back when it ends (normally, on an error, on ``sys.exit``: :func:`release_run_locks`, also at interpreter exit). The
file is a JSON record of its holder: host, pid, start time, the process's start time since boot and the boot id
(Linux), the Slurm job and requeue count and torchrun's run id and restart count, and a random token. It is written
to a temporary file first and linked into place (``os.link`` fails when the lock exists, also on NFS), so a reader
never sees half a record.

A lock left by a run that is gone (SIGKILL, a node failure, a Slurm requeue) is *stale* and taken over with a line
saying so. Stale means (:func:`stale_reason`):

* the same Slurm job (or torchrun run id) at a later requeue (restart) count: Slurm and torchrun never run two
  attempts of one job at once;
* on the same host (and boot): the holder's pid is gone, a zombie, or another process now (its start time differs);
  on the same host after a reboot: always;
* on another host, whose pids cannot be probed: no heartbeat for :data:`STALE_AFTER_SECONDS`. The holder touches the
  lock file every :data:`HEARTBEAT_SECONDS` from a daemon thread, so the file's age is the time since its holder
  was last seen alive (compared with this host's clock: hosts sharing a file system must keep their clocks within
  a minute or so, as NTP does).

Anything else is held: the start is refused in one line naming the holder and how to take over (delete the file
once that run is known to be gone). Taking over goes through a short-lived ``run.lock.takeover`` file created
exclusively, so two starts that both find a stale lock cannot both take it.
"""

import atexit
import json
import os
import socket
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

from sage_grpo.config.validation import ConfigError
from sage_grpo.safe_io import fsync_dir, read_json_object

LOCK_FILE = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 300.0  # ten missed heartbeats
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: changes at every boot
_TAKEOVER_SECONDS = 60.0  # a takeover file older than this was left by a start that died while taking over
_HELD: Dict[Path, "RunLock"] = {}  # the locks this process holds, by lock file


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _proc_stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state, start time in clock ticks since boot) of ``pid`` from /proc (Linux), else None."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces and brackets
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _env_count(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def this_process() -> dict:
    """The record a lock taken now by this process holds."""
    stat = _proc_stat(os.getpid())
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "process_start": stat[1] if stat else None, "boot_id": (_read_text(BOOT_ID) or "").strip() or None,
            "slurm_job": os.environ.get("SLURM_JOB_ID", ""), "slurm_restart": _env_count("SLURM_RESTART_COUNT"),
            "elastic_run": "" if elastic in ("", "none") else elastic,
            "elastic_restart": _env_count("TORCHELASTIC_RESTART_COUNT"), "token": uuid.uuid4().hex}


def _process_gone(record: dict) -> Optional[str]:
    """Why the holder's process on this host is gone, or None when it runs."""
    pid = record["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process {pid} is gone"
    except PermissionError:  # another user's process: it exists
        pass
    stat = _proc_stat(pid)
    if stat is not None and stat[0] in ("Z", "X"):
        return f"its process {pid} has ended"
    if stat is not None and record.get("process_start") is not None and stat[1] != record["process_start"]:
        return f"pid {pid} is another process now"
    return None


def stale_reason(record: dict, me: dict, heartbeat_age: float) -> Optional[str]:
    """Why the lock ``record`` is stale for the process ``me`` (:func:`this_process`), or None when its holder may
    run; ``heartbeat_age``: seconds since the holder last touched the lock file."""
    for job, count in (("slurm_job", "slurm_restart"), ("elastic_run", "elastic_restart")):
        if me[job] and record.get(job) == me[job] and record.get(count, 0) < me[count]:
            what = "Slurm job" if job == "slurm_job" else "torchrun run"
            return f"an earlier attempt of {what} {me[job]} (restart {record.get(count, 0)}; this is {me[count]})"
    if record["host"] == me["host"]:
        if record.get("boot_id") and me["boot_id"] and record["boot_id"] != me["boot_id"]:
            return f"{me['host']} has restarted since"
        return _process_gone(record)
    if heartbeat_age > STALE_AFTER_SECONDS:
        return f"no heartbeat from {record['host']} for {heartbeat_age:.0f} s"
    return None


def _is_me(record: dict, me: dict) -> bool:
    return (record["host"], record["pid"], record.get("process_start")) == (me["host"], me["pid"],
                                                                            me["process_start"])


def describe(record: dict, heartbeat_age: Optional[float] = None) -> str:
    beat = f", last heartbeat {heartbeat_age:.0f} s ago" if heartbeat_age is not None else ""
    return f"host {record['host']}, pid {record['pid']}, started {record['started']}{beat}"


def read_lock(path: Path) -> Optional[Tuple[dict, float]]:
    """(record, heartbeat age in seconds) of the lock file ``path``, or None when there is none; a file that is
    not a lock record is one line naming it."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    fix = f"if no run is using {path.parent}, delete {path}"
    try:
        record = read_json_object(path, "the run directory's lock", fix=fix, error=ConfigError, max_bytes=1 << 16)
    except ConfigError:
        if not path.exists():  # given back between the stat and the read
            return None
        raise
    types = {"host": str, "pid": int, "started": str, "token": str}
    if not all(type(record.get(key)) is kind for key, kind in types.items()):
        raise ConfigError(f"{path} is not a sage-grpo run lock (it lacks {', '.join(types)}); {fix}")
    return record, age


def held_message(path: Path, record: dict, age: float) -> str:
    run_dir = path.parent
    return (f"--output_dir {run_dir} is in use by another run ({describe(record, age)}): two runs in one directory "
            f"would mix their logs and delete each other's checkpoints. Wait for it to end or choose another "
            f"--output_dir; if that run is gone (it is taken over by itself when its process on this host has "
            f"ended, or after {STALE_AFTER_SECONDS:.0f} s without a heartbeat from another host), delete {path}")


def check_lock_free(run_dir: Path) -> None:
    """Refuse, changing nothing, a run directory whose lock another live run holds (the early check of a start;
    :func:`acquire_run_lock` decides again when it takes the lock)."""
    path = Path(run_dir) / LOCK_FILE
    found = read_lock(path)
    if found is None or path.resolve() in _HELD:
        return
    record, age = found
    me = this_process()
    if not _is_me(record, me) and stale_reason(record, me, age) is None:
        raise ConfigError(held_message(path, record, age))


class RunLock:
    """The lock of one run directory, held by this process; :meth:`release` gives it back (once)."""

    def __init__(self, path: Path, record: dict):
        self.path, self.record = path, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_until_released, name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def beat(self) -> bool:
        """Touch the lock file (the heartbeat another host reads); False once it is no longer this run's."""
        try:
            found = read_lock(self.path)
        except ConfigError:
            found = None
        if found is None or found[0].get("token") != self.record["token"]:
            warnings.warn(f"the lock {self.path} is no longer this run's (deleted or taken over); another run may now "
                          "write in this directory", RuntimeWarning, stacklevel=2)
            return False
        try:
            os.utime(self.path)
        except OSError:
            return False
        return True

    def _beat_until_released(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self.beat():
                return

    def release(self) -> None:
        """Give the lock back: the file is deleted if it is still this run's (never another run's that took over)."""
        self._stop.set()
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        if os.getpid() != self.record["pid"]:  # a forked child never gives back its parent's lock
            return
        try:
            found = read_lock(self.path)
            if found is not None and found[0].get("token") == self.record["token"]:
                self.path.unlink()
        except (OSError, ConfigError):
            pass


def _write_record(path: Path, record: dict) -> None:
    with open(path, "w") as handle:
        handle.write(json.dumps(record, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def _takeover_guard(run_dir: Path) -> Iterator[None]:
    """Exclusive right to replace a stale lock, for a few seconds (one ``run.lock.takeover`` file)."""
    guard = run_dir / f"{LOCK_FILE}.takeover"
    for _ in range(2):
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            break
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > _TAKEOVER_SECONDS:
                    guard.unlink(missing_ok=True)
                    continue
            except FileNotFoundError:
                continue
            raise ConfigError(f"another start is taking over the lock of --output_dir {run_dir} right now; try "
                              f"again in a minute (or delete {guard} if no start is running)") from None
    else:
        raise ConfigError(f"could not take over the lock of --output_dir {run_dir}; delete {guard} and try again")
    try:
        yield
    finally:
        guard.unlink(missing_ok=True)


def acquire_run_lock(run_dir: Path, note: Callable[[str], None] = lambda line: print(f"note: {line}")) -> RunLock:
    """Take the lock of ``run_dir`` (an existing folder) for this process, taking over a stale one (``note`` gets
    the line that says so); a lock another live run holds is a ConfigError naming it. Taking a lock this process
    holds already returns it."""
    path = (Path(run_dir) / LOCK_FILE).resolve()
    if path in _HELD:
        held = _HELD[path]
        found = read_lock(path)
        if found is not None and found[0].get("token") == held.record["token"]:
            return held
        held.release()  # its file was deleted or taken over meanwhile: taken again below, by the rules
    me = this_process()
    tmp = path.with_name(f".{LOCK_FILE}.{me['pid']}.{me['token'][:8]}.tmp")
    _write_record(tmp, me)
    try:
        for _ in range(3):
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                if _take_over(path, tmp, me, note):
                    break
        else:
            raise ConfigError(f"could not take the lock {path}: other starts kept taking it; try again")
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    lock = _HELD[path] = RunLock(path, me)
    return lock


def _take_over(path: Path, tmp: Path, me: dict, note: Callable[[str], None]) -> bool:
    """Replace the lock at ``path`` when its holder is gone (True), refuse when it may run; False: try again (the
    lock changed hands meanwhile)."""
    found = read_lock(path)
    if found is None:
        return False
    record, age = found
    reason = "an earlier run of this process" if _is_me(record, me) else stale_reason(record, me, age)
    if reason is None:
        raise ConfigError(held_message(path, record, age))
    with _takeover_guard(path.parent):
        again = read_lock(path)
        if again is None or again[0].get("token") != record["token"]:
            return False
        path.unlink()
        try:
            os.link(tmp, path)
        except FileExistsError:  # a start that found no lock took it in between: its lock decides, again
            return False
    if not _is_me(record, me):
        note(f"took over the lock of --output_dir {path.parent} from a run that is gone ({describe(record)}: "
             f"{reason})")
    return True


def release_run_locks() -> None:
    """Give back every lock this process holds (at the end of a run, and at interpreter exit)."""
    for lock in list(_HELD.values()):
        lock.release()


atexit.register(release_run_locks)

"""Where a command may write, and writing files that must survive a crash or a full disk: :func:`atomic_write`
(the one writer of every file the project rewrites), :func:`disk_full_as_error`, the fsync helpers.

Imports no torch except in :func:`nbytes_of`: download_weights.sh's lock-file tools write through here.
"""

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any, Union

from sage_grpo.faults import fault_point

PathLike = Union[str, Path]


def megabytes(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


# ---------------------------------------------------------------- where a command may write

def check_output_outside_inputs(output: PathLike, option: str, inputs: dict) -> None:
    """Refuse an ``output`` folder (the flag ``option``) that is, or lies inside, one of ``inputs`` ({flag: path};
    None entries are skipped), links resolved: writing there would change what the command reads (an export into
    its model root copied the root into itself). Checked before anything is written."""
    target = Path(output).resolve()
    for name, source in inputs.items():
        if source is None or str(source) == "":
            continue
        resolved = Path(source).resolve()
        if target == resolved or resolved in target.parents:
            where = "is" if target == resolved else "lies inside"
            raise ValueError(f"{option} {output} {where} {name} {source}: the command would write into what it "
                             f"reads. Choose an {option} outside {source}")


# ---------------------------------------------------------------- writing files that must survive a crash

class DiskFullError(OSError):
    """A write that ran out of space (ENOSPC): names the file and the space it needed (``path``, ``needed``)."""

    path: Path = Path(".")
    needed: int = 0


def disk_full_error(path: PathLike, needed_bytes: int, outcome: str = "the file was not replaced") -> DiskFullError:
    """The one-line error of a write to ``path`` that needed about ``needed_bytes`` and found the disk full;
    ``outcome`` says what was left as it was."""
    path = Path(path)
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(folder).free
    error = DiskFullError(errno.ENOSPC, f"disk full while writing {path}: it needs about {megabytes(needed_bytes)} "
                          f"and {megabytes(free)} is free there. Free space on that file system, or point "
                          f"--output_dir at another one ({outcome})")
    error.path, error.needed = path, needed_bytes
    return error


# How writers without a Python errno say ENOSPC / EDQUOT: safetensors' Rust writer raises SafetensorError("Error
# while serializing: I/O error: No space left on device (os error 28)"), not an OSError.
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", f"(os error {errno.ENOSPC})",
                    f"(os error {errno.EDQUOT})")


def is_disk_full(err: BaseException, path: PathLike, needed_bytes: int) -> bool:
    """Whether ``err`` from writing ``path`` means the disk is full: ENOSPC (an OSError, or another writer's error
    that says so, as safetensors' does), or (torch's C++ writer reports "basic_ios::clear: iostream error" or "file
    write failed" without an errno) less free space than was needed."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if any(text in str(err) for text in _DISK_FULL_TEXTS):
        return True
    if isinstance(err, RuntimeError):
        folder = next((p for p in (Path(path), *Path(path).parents) if p.exists()), Path("."))
        return shutil.disk_usage(folder).free < needed_bytes
    return False


def fsync_dir(folder: PathLike) -> None:
    """Make a rename or a new file in ``folder`` durable (a directory's entries are flushed with the directory)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def fsync_tree(root: PathLike) -> None:
    """fsync every file and folder under ``root`` (a checkpoint before it is renamed into place)."""
    for folder, _, files in os.walk(root):
        for name in files:
            handle = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
        fsync_dir(folder)


def atomic_write(path: PathLike, data: Union[str, bytes]) -> None:
    """Replace ``path`` with ``data`` so that a crash at any moment leaves either the old file or the new one: a
    temporary file in the same folder, fsynced, then renamed over ``path`` (and the folder fsynced). The one writer
    of every file the project rewrites. A full disk raises :class:`DiskFullError` and leaves ``path`` as it was."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err, path, len(payload)):
            raise disk_full_error(path, len(payload)) from None
        raise
    fault_point("rewrite", path.name)  # tests: a kill here must leave the old file whole
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def disk_full_as_error(path: PathLike, needed_bytes: int):
    """Turn a full disk while writing ``path`` (about ``needed_bytes``) into :class:`DiskFullError`; any other
    error passes unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:  # OSError, torch's RuntimeError, safetensors' SafetensorError, peft's re-raises
        if is_disk_full(err, path, needed_bytes):
            raise disk_full_error(path, needed_bytes) from None
        raise


def nbytes_of(obj: Any) -> int:
    """The tensor bytes in a (nested) state dict: what writing it needs, about."""
    import torch

    def count(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(count(value) for value in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(count(value) for value in obj)
        return 0

    return count(obj)

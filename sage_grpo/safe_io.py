"""Loading files a user is handed without running code from them.

Pickle-based files can name any Python callable and have it called while loading. Every such file this project reads
goes through this module:

* ``training_state.pt``, ``optimizer.pt``, the prompt-embedding cache: :func:`load_plain`, ``torch.load`` with
  ``weights_only=True`` (tensors, numbers, strings, lists, tuples, dicts, dtypes; the NumPy RNG state that earlier
  versions stored is accepted as a plain array). Anything else is refused with :class:`UnsafeFileError`.
* A sharded checkpoint's ``.metadata`` (``torch.distributed.checkpoint`` pickles it): :func:`read_dcp_metadata`, an
  unpickler that only builds the DCP metadata classes and a few plain types.
* The non-tensor values a DCP checkpoint stores as bytes (optimizer hyper-parameters): :class:`SafeLoadPlanner` loads
  them with ``weights_only=True`` (torch's default planner uses ``weights_only=False``).

safetensors files and YAML (``yaml.SafeLoader``) hold plain data by construction.
"""

import contextlib
import errno
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Union

from sage_grpo.faults import fault_point

# torch is imported inside the functions that use it: the JSON readers, atomic writes and path checks serve
# download_weights.sh's lock-file and layout tools, which never need torch (its import is over a second per call).

PathLike = Union[str, Path]


class CheckpointError(ValueError):
    """A checkpoint or cache file that is missing, incomplete, truncated or not plain data (names the path)."""


class UnsafeFileError(CheckpointError):
    """A file that would run code (or build objects other than plain data) if loaded."""


def _numpy_globals() -> list:
    """NumPy's array reconstruction, for the RNG state earlier versions stored (builds arrays, calls nothing)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's requirements here
        return []
    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [getattr(dtypes, name) for name in ("UInt32DType", "Int64DType", "Float64DType") if hasattr(dtypes,
                                                                                                           name)]
    return found


def _refusal_reason(err: Exception) -> str:
    """The line of torch's weights-only error that names the refused global."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (named or lines or [type(err).__name__])[0][:200]


_PLAIN_FIX = "Use a file written by sage-grpo, or start a new run from the weights only"


def load_plain(path: PathLike, what: str, fix: str = _PLAIN_FIX) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; a file that needs more is refused, naming ``path`` (and
    ``fix``, what to use instead)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {path} is missing")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeFileError(f"refusing to load {what} {path}: it holds Python objects other than tensors and plain "
                              f"data, which could run code when loaded ({_refusal_reason(err)}). {fix}") from None
    except Exception as err:  # a garbled pickle raises EOFError, IndexError, KeyError, ... from the unpickler
        raise CheckpointError(f"cannot read {what} {path}: {type(err).__name__}: {str(err)[:200]} (is it truncated? "
                              "an interrupted copy leaves such files; use another checkpoint)") from None


def check_finite(tensors: Any, source: str, name: str = "") -> None:
    """Refuse weights (a mapping or sequence of tensors, nested as an optimizer state is) holding NaN or inf, naming
    ``source`` and the first such tensor: sampled or trained on, they give NaN videos and NaN updates, never a clear
    error. A DTensor is checked on this rank's shard (no collective: ``checkpoint.py`` makes the ranks agree)."""
    import torch
    from torch.distributed.tensor import DTensor

    def check(tensors: Any, name: str) -> None:
        if isinstance(tensors, torch.Tensor):
            local = tensors.to_local() if isinstance(tensors, DTensor) else tensors
            if local.is_floating_point() and not bool(torch.isfinite(local).all()):
                raise CheckpointError(f"{source}: {name or 'a tensor'} holds NaN or inf values (corrupt or diverged "
                                      "weights); use another checkpoint or weights file")
        elif isinstance(tensors, dict):
            for key, value in tensors.items():
                check(value, f"{name}.{key}" if name else str(key))
        elif isinstance(tensors, (list, tuple)):
            for index, value in enumerate(tensors):
                check(value, f"{name}[{index}]")

    check(tensors, name)


# ---------------------------------------------------------------- JSON files of a model folder

MAX_JSON_BYTES = 16 << 20  # a model folder's configs and shard indices are kilobytes (an 8B model's index: ~100 KB)
_JSON_FIX = "download or copy the model folder again (bash download_weights.sh)"


def read_json_object(path: PathLike, what: str, fix: str = _JSON_FIX, error: type = CheckpointError,
                     max_bytes: int = MAX_JSON_BYTES) -> dict:
    """The JSON object in ``path`` (``what`` it is, e.g. "the VAE config"), read as data: a missing, oversized (over
    ``max_bytes``), undecodable, too deeply nested or non-object file is one ``error`` line naming the file and
    ``fix``. Every JSON file the project reads back (configs, indices, locks, records, caches) is read here."""
    path = Path(path)
    try:
        size = path.stat().st_size
        data = json.loads(path.read_bytes()) if size <= max_bytes else None
    except (OSError, ValueError, RecursionError) as err:  # ValueError: JSON, UTF-8, an integer of 4300+ digits
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise error(f"cannot read {what} {path}: {reason}; {fix}") from None
    if size > max_bytes:
        raise error(f"{what} {path} is {_megabytes(size)}, more than such a file holds ({_megabytes(max_bytes)})"
                    f"; {fix}")
    if not isinstance(data, dict):
        raise error(f"{what} {path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def read_weight_map(index: PathLike, error: type = CheckpointError) -> dict:
    """{tensor name: shard file name} of a safetensors index (``*.index.json``), each shard a plain file name beside
    the index (a name with a folder in it would read weights from elsewhere)."""
    weight_map = read_json_object(index, "the weight index", error=error).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise error(f"{index}: 'weight_map' must map tensor names to shard file names; {_JSON_FIX}")
    for name in set(weight_map.values()):
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise error(f"{index}: the shard {name[:100]!r} is not a file name beside the index; {_JSON_FIX}")
    return weight_map


def shard_names(index: PathLike, error: type = CheckpointError) -> list:
    """The shard file names of a safetensors index, sorted (:func:`read_weight_map`)."""
    return sorted(set(read_weight_map(index, error).values()))


# ---------------------------------------------------------------- torch.distributed.checkpoint

_DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _DCPMetadataUnpickler(pickle.Unpickler):
    """Builds only the classes DCP metadata is made of (and torch dtypes); any other global is refused."""

    def __init__(self, file, source: Path):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        import torch

        if name in _DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeFileError(f"refusing to read {self.source}: it names {module}.{name}, which is not part of "
                              "torch.distributed.checkpoint metadata (a crafted file can run code this way). Use a "
                              "checkpoint written by sage-grpo or torch.distributed.checkpoint")

    def persistent_load(self, pid):
        raise UnsafeFileError(f"refusing to read {self.source}: persistent ids are not part of DCP metadata")


def read_dcp_metadata(folder: PathLike):
    """The ``Metadata`` of the DCP checkpoint in ``folder``, unpickled with :class:`_DCPMetadataUnpickler`."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(folder) / ".metadata"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: {folder} is not a complete torch.distributed.checkpoint folder")
    try:
        metadata = _DCPMetadataUnpickler(io.BytesIO(path.read_bytes()), path).load()
    except UnsafeFileError:
        raise
    except Exception as err:  # truncated or garbled pickle
        raise CheckpointError(f"cannot read {path}: {type(err).__name__}: {str(err)[:200]} (truncated or not DCP "
                              "metadata)") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeFileError(f"refusing to read {path}: it holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def safe_dcp_reader(folder: PathLike):
    """A ``FileSystemReader`` whose metadata comes from :func:`read_dcp_metadata` (tensor data is already read with
    ``weights_only=True`` by torch)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(self.path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(folder))


def safe_load_planner(allow_partial_load: bool = True):
    """A ``DefaultLoadPlanner`` that loads byte items (non-tensor values) with ``weights_only=True``."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            # Load with weights_only=True, then hand the default planner (which places the value in the nested state
            # dict, through private helpers) a re-serialisation of that plain data: its own weights_only=False load
            # then only sees what was just written here. The items are small (optimizer hyper-parameters).
            try:
                loaded = torch.load(value, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as err:
                raise UnsafeFileError(f"refusing to load {read_item.dest_index.fqn} from a DCP checkpoint: it is "
                                      f"not plain data ({_refusal_reason(err)})") from None
            value = io.BytesIO()
            torch.save(loaded, value)
            value.seek(0)
            super().load_bytes(read_item, value)

    return SafeLoadPlanner(allow_partial_load=allow_partial_load)


def dcp_load(state: dict, folder: PathLike, *, allow_partial_load: bool = True) -> None:
    """``torch.distributed.checkpoint.load`` into ``state`` in place, through the safe reader and planner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=safe_dcp_reader(folder), planner=safe_load_planner(allow_partial_load))
    except CheckpointException as err:  # DCP wraps each rank's exception (with its stack) in a tuple
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in err.failures.values()]
        for cause in causes:
            if isinstance(cause, CheckpointError):
                raise cause from None
        # a shard (.distcp) that torch's weights-only reader cannot read: truncated, or replaced by another file
        cause = causes[0] if causes else err
        unsafe = isinstance(cause, pickle.UnpicklingError)  # torch's text would suggest weights_only=False: not echoed
        reason = _refusal_reason(cause) if unsafe else f"{type(cause).__name__} {str(cause)[:200]!r}"
        raise (UnsafeFileError if unsafe else CheckpointError)(
            f"cannot read the DCP checkpoint {folder}: a shard is not tensor data written by "
            f"torch.distributed.checkpoint ({reason}). Was a .distcp file truncated or replaced? Use another "
            "checkpoint") from None


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


def _megabytes(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def disk_full_error(path: PathLike, needed_bytes: int, outcome: str = "the file was not replaced") -> DiskFullError:
    """The one-line error of a write to ``path`` that needed about ``needed_bytes`` and found the disk full;
    ``outcome`` says what was left as it was."""
    path = Path(path)
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(folder).free
    error = DiskFullError(errno.ENOSPC, f"disk full while writing {path}: it needs about {_megabytes(needed_bytes)} "
                          f"and {_megabytes(free)} is free there. Free space on that file system, or point "
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

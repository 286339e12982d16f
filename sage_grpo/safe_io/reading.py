"""Reading a file a user is handed as plain data: ``torch.load`` restricted to tensors and plain values
(:func:`load_plain`), weights checked finite (:func:`check_finite`), and the one reader of JSON files
(:func:`read_json_object`, :func:`read_weight_map`).

torch is imported inside the functions that use it: the JSON readers serve download_weights.sh's lock-file and layout
tools, which never need torch (its import is over a second per call).
"""

import json
import pickle
from pathlib import Path
from typing import Any

from sage_grpo.safe_io.writing import PathLike, megabytes


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


def refusal_reason(err: Exception) -> str:
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
                              f"data, which could run code when loaded ({refusal_reason(err)}). {fix}") from None
    except Exception as err:  # a garbled pickle raises EOFError, IndexError, KeyError, ... from the unpickler
        raise CheckpointError(f"cannot read {what} {path}: {type(err).__name__}: {str(err)[:200]} (is it truncated? "
                              "an interrupted copy leaves such files; use another checkpoint)") from None


def check_finite(tensors: Any, source: str, name: str = "") -> None:
    """Refuse weights (a mapping or sequence of tensors, nested as an optimizer state is) holding NaN or inf, naming
    ``source`` and the first such tensor: sampled or trained on, they give NaN videos and NaN updates, never a clear
    error. A DTensor is checked on this rank's shard (no collective: ``sage_grpo.checkpoint`` makes the ranks agree)."""
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
        raise error(f"{what} {path} is {megabytes(size)}, more than such a file holds ({megabytes(max_bytes)})"
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


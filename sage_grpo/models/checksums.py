"""Per-file sha256 checksums of a checkpoint root, checked whenever the root is loaded.

A root that holds ``checksums.json`` (the committed toy checkpoint ``assets/toy_ckpt`` and the copies written from it or
trained by ``scripts/make_toy_checkpoint.py``) lists the sha256 of each of its files there, with the command that
rebuilds it. :func:`verify_checksums` hashes every listed file before a model is read from the root and refuses the
first that is missing or differs, in one line naming the file and that command. A root without the file (downloaded
weights, the tiny test checkpoints) is loaded as before.
"""

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Dict, Optional, Union

from sage_grpo.safe_io import CheckpointError, atomic_write, read_json_object

CHECKSUMS_FILE = "checksums.json"
NOT_LISTED = (CHECKSUMS_FILE, ".complete")  # the list itself, and the marker written after it
_HEX = re.compile(r"[0-9a-f]{64}")
_FIX = "restore the folder or rebuild it"

PathLike = Union[str, Path]


class ChecksumError(CheckpointError):
    """A file of a checksummed root that is missing or does not match its recorded sha256."""


def sha256_of(path: PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(root: PathLike) -> Dict[str, str]:
    """{posix path below ``root``: sha256} of every file under ``root`` but :data:`NOT_LISTED`, sorted."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in NOT_LISTED)
    return {p.relative_to(root).as_posix(): sha256_of(p) for p in files}


def write_checksums(root: PathLike, rebuild: str, **record) -> Dict:
    """Write ``checksums.json`` for every file now under ``root``; ``rebuild``: the command that rebuilds the root
    (quoted in a refusal); ``record``: more JSON fields kept beside the list. Returns what it wrote."""
    data = {"algorithm": "sha256", "rebuild": rebuild, **record, "files": file_checksums(root)}
    atomic_write(Path(root) / CHECKSUMS_FILE, json.dumps(data, indent=1) + "\n")
    return data


def read_checksums(root: PathLike) -> Optional[Dict]:
    """The validated ``checksums.json`` of ``root``, or None when it has none."""
    path = Path(root) / CHECKSUMS_FILE
    if not path.is_file():
        return None
    data = read_json_object(path, "the checksum list", fix=_FIX)
    files, rebuild = data.get("files"), data.get("rebuild")
    if not isinstance(rebuild, str) or "\n" in rebuild or len(rebuild) > 400:
        raise CheckpointError(f"the checksum list {path} has no one-line 'rebuild' command; {_FIX}")
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"the checksum list {path} lists no files; {_FIX}")
    for name, digest in files.items():
        parts = PurePosixPath(name).parts
        if not isinstance(digest, str) or not _HEX.fullmatch(digest) or name.startswith("/") or ".." in parts:
            raise CheckpointError(f"the checksum list {path} has a bad entry {name!r}: {digest!r}; {_FIX}")
    return data


def verify_checksums(root: PathLike) -> bool:
    """Hash every file ``checksums.json`` lists under ``root``; raise :class:`ChecksumError` at the first missing or
    different one. False when the root has no checksum list (nothing to check)."""
    data = read_checksums(root)
    if data is None:
        return False
    for name, digest in data["files"].items():
        path = Path(root) / name
        if not path.is_file():
            raise ChecksumError(f"{path} is missing (listed in {Path(root) / CHECKSUMS_FILE}); {data['rebuild']}")
        if sha256_of(path) != digest:
            raise ChecksumError(f"{path} does not match its sha256 in {Path(root) / CHECKSUMS_FILE} (changed or "
                                f"damaged); {data['rebuild']}")
    return True

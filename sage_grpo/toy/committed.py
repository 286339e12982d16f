"""The committed toy checkpoint (``assets/toy_ckpt``): packed once from a trained one, installed where the demo reads it.

Every machine trains the toy checkpoint a little differently (its sums run in other orders) and GRPO amplifies such
differences, so the demo reads one checkpoint trained once and committed. ``assets/toy_ckpt`` holds the real layout
written by ``scripts/make_toy_checkpoint.py`` except the transformer's byT5 glyph projection (``context_embedder_2``,
90% of its parameters, 17 MB in fp32): toy prompts never quote text, so that stream is all padding and its output is
masked out of attention. The builder sets it to zeros (:func:`sage_grpo.toy.pretrain.write_toy_checkpoint`); the
committed copy records its shapes instead of the zeros. ``toy_build.json`` records the command, the recipe and the
machine that built it; ``checksums.json`` the sha256 of every file (:mod:`sage_grpo.models.checksums`).

:func:`install` checks that folder and writes the full checkpoint (zeros restored, its own ``checksums.json``) in a
second; :func:`pack` writes the committed form of a trained checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Dict, List

from sage_grpo.models.checksums import CHECKSUMS_FILE, read_checksums, sha256_of, verify_checksums, write_checksums
from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION, transformer_layout
from sage_grpo.safe_io import CheckpointError, atomic_write, read_json_object
from sage_grpo.toy.pretrain import COMPLETE_MARKER, DEAD_PREFIX, REPORT_FILE, machine, toy_recipe

COMMITTED = Path(__file__).resolve().parents[2] / "assets" / "toy_ckpt"
BUILD_FILE = "toy_build.json"
WEIGHTS = f"{transformer_layout(DEFAULT_TRANSFORMER_VERSION).subdir}/diffusion_pytorch_model.safetensors"
INSTALL_COMMAND = "python scripts/make_toy_checkpoint.py --committed --output {output} --force"
RESTORE = "restore it with `git checkout -- assets/toy_ckpt`, or rebuild it: {command}"
MAX_DIM = 1 << 16


def _replace(staging: Path, dest: Path) -> None:
    """Move the complete ``staging`` folder to ``dest``, replacing what is there only now that the new one is whole."""
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)


def _staging(dest: Path) -> Path:
    staging = dest.parent / f".{dest.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    return staging


def pack(trained: Path, dest: Path, command: str) -> Dict:
    """Write the committed form of the complete toy checkpoint ``trained`` to ``dest`` (replaced only once the new one
    is whole); ``command`` is the one that built ``trained``, recorded with the recipe. Returns the build record."""
    from safetensors.torch import load_file, save_file

    if not (trained / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{trained} is not a complete toy checkpoint (no {COMPLETE_MARKER}); build it first: "
                              "python scripts/make_toy_checkpoint.py --output ckpts/toy")
    report = read_json_object(trained / REPORT_FILE, "the toy report")
    staging = _staging(dest)
    shutil.copytree(trained, staging, ignore=shutil.ignore_patterns(COMPLETE_MARKER, CHECKSUMS_FILE, BUILD_FILE))
    tensors = load_file(staging / WEIGHTS)
    dead = sorted(name for name in tensors if name.startswith(DEAD_PREFIX))
    zero_tensors = {name: list(tensors.pop(name).shape) for name in dead}
    save_file(tensors, staging / WEIGHTS, metadata={"format": "pt"})
    record = {"command": command, "recipe": toy_recipe(report["settings"]), "torch": report.get("torch"),
              "built_on": report.get("machine") or machine(),
              "packed": time.strftime("%Y-%m-%d"), "zero_tensors": zero_tensors,
              "evaluation": report.get("evaluation")}
    atomic_write(staging / BUILD_FILE, json.dumps(record, indent=1) + "\n")
    write_checksums(staging, RESTORE.format(command=command))
    _replace(staging, dest)
    return record


def _zero_tensors(record: Dict, source: Path) -> Dict[str, List[int]]:
    """The recorded shapes of the zeroed projection, validated (a name of it, at most two dimensions)."""
    shapes = record.get("zero_tensors")
    bad = f"the build record {source / BUILD_FILE} has a bad 'zero_tensors' entry"
    if not isinstance(shapes, dict):
        raise CheckpointError(f"{bad}; {RESTORE.format(command=record.get('command'))}")
    for name, shape in shapes.items():
        if (not name.startswith(DEAD_PREFIX) or not isinstance(shape, list) or not 1 <= len(shape) <= 2
                or not all(isinstance(d, int) and 0 < d <= MAX_DIM for d in shape)):
            raise CheckpointError(f"{bad} {name!r}: {shape!r}")
    return shapes


def source_digest(source: Path = COMMITTED) -> str:
    """What identifies a committed checkpoint: the sha256 of its checksum list."""
    return sha256_of(source / CHECKSUMS_FILE)


def is_current_install(dest: Path, source: Path = COMMITTED) -> bool:
    """Whether ``dest`` was installed from this very committed checkpoint (its files are checked at load)."""
    data = read_checksums(dest) if dest.is_dir() else None
    return data is not None and data.get("source") == source_digest(source)


def is_replaceable_install(dest: Path) -> bool:
    """Whether ``dest`` is an unchanged install of some committed checkpoint (safe to replace by another)."""
    data = read_checksums(dest)
    if data is None or "source" not in data:
        return False
    try:
        return verify_checksums(dest)
    except CheckpointError:
        return False


def install(dest: Path, source: Path = COMMITTED) -> None:
    """Check the committed checkpoint ``source`` and write its full form to ``dest`` (replacing ``dest`` only once
    the new one is whole). The caller decides whether ``dest`` may be replaced."""
    import torch
    from safetensors.torch import load_file, save_file

    if read_checksums(source) is None:
        raise CheckpointError(f"{source} has no {CHECKSUMS_FILE}: not the committed toy checkpoint; restore it with "
                              "`git checkout -- assets/toy_ckpt`")
    verify_checksums(source)
    record = read_json_object(source / BUILD_FILE, "the toy build record")
    shapes = _zero_tensors(record, source)
    staging = _staging(dest)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(CHECKSUMS_FILE))
    tensors = load_file(staging / WEIGHTS)
    tensors.update({name: torch.zeros(shape) for name, shape in shapes.items()})
    save_file(tensors, staging / WEIGHTS, metadata={"format": "pt"})
    write_checksums(staging, f"rebuild it: {INSTALL_COMMAND.format(output=dest)}", source=source_digest(source))
    (staging / COMPLETE_MARKER).write_text("ok\n")
    _replace(staging, dest)

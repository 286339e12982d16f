"""Trained weights checked as loadable without reading a tensor, and identified by their content.

:func:`check_loadable` opens what :func:`~sage_grpo.export.weights.read_trained_weights` would read (safetensors
headers, a DCP folder's metadata through the safe unpickler, an adapter folder's config) and compares the names and
shapes with the base transformer built on the ``meta`` device: an evaluation knows every checkpoint loads before it
samples the first video, and a pickle, a truncated file or weights of another model are one line naming the file.

:func:`weights_digest` is the content digest of those files (SHA-256 of every byte, with their names): what an
evaluation's cache is keyed by, so new weights written to an old checkpoint path are sampled again instead of served
the old scores. It reads every byte (SHA-256: 0.8 s of CPU per GiB on the 2-core test machine, docs/evaluation.md),
which is why it is taken once per checkpoint and evaluation, not per video.
"""

import hashlib
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Protocol, Tuple, Union

from sage_grpo.checkpoint_layout import CONFIG_FILE, DCP_DIR, LORA_DIR, TRANSFORMER_FILE
from sage_grpo.config.train import LoRAConfig, ModelConfig
from sage_grpo.models import lora, lora_folder
from sage_grpo.safe_io import CheckpointError, shard_names

PathLike = Union[str, Path]
Shapes = Dict[str, Tuple[int, ...]]
_CHUNK = 8 << 20


def transformer_shapes(model_root: PathLike, version: str, parameters_only: bool = False) -> Shapes:
    """{parameter or buffer name: shape} of the base transformer ``version`` of ``model_root`` (no memory used);
    ``parameters_only``: its parameters, what a full fine-tune trains and checkpoints."""
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    from sage_grpo.models import layout

    folder = Path(model_root) / layout.transformer_layout(version).subdir
    config = HunyuanVideo15Transformer3DModel.load_config(str(folder), local_files_only=True)
    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel.from_config(config)
    tensors = dict(model.named_parameters()) if parameters_only else model.state_dict()
    return {name: tuple(tensor.shape) for name, tensor in tensors.items()}


def _safetensors_shapes(file: Path) -> Shapes:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except Exception as err:  # SafetensorError, OSError
        raise CheckpointError(f"cannot read trained weights {file}: {str(err)[:200]} (truncated or not a safetensors "
                              "file)") from None


def _index_shards(index: Path) -> List[Path]:
    return [index.parent / name for name in shard_names(index)]


def stored_shapes(located: Path) -> Shapes:
    """{key: shape} of the tensors at ``located`` (a weights file, a shard index, a DCP or adapter folder)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from sage_grpo.export.weights import DCP_NESTING, is_dcp_folder
    from sage_grpo.safe_io import read_dcp_metadata

    if lora_folder.is_adapter_folder(located):
        return lora_folder.strip_key_prefix(_safetensors_shapes(located / lora_folder.ADAPTER_WEIGHTS_FILE))
    if is_dcp_folder(located):
        tensors = {key: tuple(meta.size) for key, meta in read_dcp_metadata(located).state_dict_metadata.items()
                   if isinstance(meta, TensorStorageMetadata)}
        nested = any(key.startswith(DCP_NESTING) for key in tensors)
        return {key[len(DCP_NESTING):]: shape for key, shape in tensors.items() if key.startswith(DCP_NESTING)} \
            if nested else tensors
    if located.name.endswith(".index.json"):
        shapes: Shapes = {}
        for shard in _index_shards(located):
            shapes.update(_safetensors_shapes(shard))
        return shapes
    return _safetensors_shapes(located)


def mismatches(stored: Shapes, expected: Shapes) -> List[str]:
    """What keeps ``stored`` from loading into a transformer of ``expected`` (full weights or a LoRA adapter)."""
    adapter = {key: shape for key, shape in stored.items() if lora.is_adapter_key(key)}
    if adapter:  # LoRA: every adapted module exists, and its A / B fit the module's input / output width
        problems = []
        for key, shape in adapter.items():
            module = key.split(".lora_", 1)[0]
            base = expected.get(f"{module}.weight")
            if base is None or len(base) != 2 or len(shape) != 2:
                problems.append(f"{key} adapts no linear layer of the transformer")
            elif (".lora_A." in key and shape[1] != base[1]) or (".lora_B." in key and shape[0] != base[0]):
                problems.append(f"{key} {list(shape)} does not fit {module} {list(base)}")
        return problems
    missing, unexpected = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    shaped = sorted(k for k in set(stored) & set(expected) if stored[k] != expected[k])
    return [f"{what} keys ({len(keys)}): {', '.join(keys[:5])}" for what, keys in
            (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shaped)) if keys]


def training_shapes(checkpoint: Path, sharded: bool) -> Shapes:
    """{name: shape} of the trainable weights a training ``checkpoint-N`` holds (all of them, or the LoRA adapter's),
    read from its safetensors header or its DCP metadata: no tensor is read."""
    return stored_shapes(checkpoint / (DCP_DIR if sharded else TRANSFORMER_FILE))


def adapter_rank(shapes: Shapes) -> Optional[int]:
    """The LoRA rank of an adapter's tensors (its A matrices' rows); None: no adapter tensor."""
    return next((shape[0] for key, shape in shapes.items() if ".lora_A." in key and len(shape) == 2), None)


_NO_RESHAPE = "tensors of other shapes cannot load, not even with --allow_config_change"


class ResumeShapeOptions(Protocol):
    """What the shapes a run builds are read from: the configuration's ``lora`` section (LoRA or not, the rank, the
    targets) and its ``model`` section (the transformer), declared by shape."""

    lora: LoRAConfig
    model: ModelConfig


def _run_rank(options: LoRAConfig) -> int:
    """The LoRA rank a run builds: its --pretrained_lora_path adapter's, else --lora_r."""
    if options.pretrained_lora_path:
        return lora_folder.check_adapter_folder(Path(options.pretrained_lora_path))["r"]
    return options.lora_r


def _check_adapter(checkpoint: Path, rank: Optional[int], saved: Dict, options: LoRAConfig) -> None:
    """The LoRA side of :func:`check_resume_shapes` (``options``: the run's ``lora`` section): LoRA or not, the rank,
    the target modules."""
    from sage_grpo.config.validation import ConfigError

    adapter = checkpoint / LORA_DIR
    if (rank is not None) != options.use_lora:
        raise ConfigError(f"resuming {checkpoint} with --use_lora {options.use_lora}: it holds "
                          f"{'a LoRA adapter' if rank is not None else 'full transformer weights'} ({_NO_RESHAPE}). "
                          f"Resume with --use_lora {rank is not None}, or start a new run in a new --output_dir")
    if rank is None:
        return
    if rank != _run_rank(options):
        given = "its --pretrained_lora_path adapter's" if options.pretrained_lora_path else f"--lora_r {options.lora_r}"
        raise ConfigError(f"resuming {checkpoint} with LoRA rank {_run_rank(options)} ({given}): its adapter has rank "
                          f"{rank}, and an adapter's shapes cannot change ({_NO_RESHAPE}). Resume with --lora_r "
                          f"{rank}, or start a new run from this adapter: --pretrained_lora_path {adapter}")
    targets = saved.get("lora_target_modules", options.lora_target_modules)
    if not options.pretrained_lora_path and targets != options.lora_target_modules:
        raise ConfigError(f"resuming {checkpoint} with --lora_target_modules {options.lora_target_modules}: its "
                          f"adapter adapts the layers of {targets}, and its tensors cannot move to other layers "
                          f"({_NO_RESHAPE}). Resume with its targets, or start a new run from this adapter: "
                          f"--pretrained_lora_path {adapter}")


def check_resume_shapes(checkpoint: Path, sharded: bool, saved: Dict, cfg: ResumeShapeOptions,
                        differences: Dict) -> None:
    """Refuse (one ConfigError line, before any model loads) a resume of ``checkpoint`` whose trainable tensors
    cannot load into the run ``cfg`` builds, whatever ``--allow_config_change`` says: full weights into a LoRA run
    or the reverse, an adapter of another rank or other target modules, weights of another transformer's shapes
    (checked when the transformer version or the model root is among ``differences``). ``saved``: the checkpoint's
    recorded settings. LoRA alpha and dropout shape no tensor: they may change like any allowed setting."""
    from sage_grpo.config.validation import ConfigError

    stored = training_shapes(checkpoint, sharded)
    _check_adapter(checkpoint, adapter_rank(stored), saved, cfg.lora)
    changed = [key for key in differences if key == "pretrained_transformer_version" or key.startswith("model root")]
    if not changed:
        return
    model = cfg.model
    problems = mismatches(stored, transformer_shapes(model.pretrained_model_root, model.pretrained_transformer_version,
                                                     parameters_only=True))
    if problems:
        raise ConfigError(f"resuming {checkpoint} with another {' and '.join(changed)}: its trainable weights do not "
                          f"fit the transformer {model.pretrained_transformer_version} of "
                          f"{model.pretrained_model_root} ({'; '.join(problems[:2])}; {_NO_RESHAPE}). Resume with the "
                          "checkpoint's model root and transformer version, or start a new run in a new --output_dir")


def check_loadable(path: PathLike, expected: Shapes, option: str) -> Path:
    """Raise :class:`CheckpointError` (one line, naming ``option`` and the file) unless the trained weights at
    ``path`` can be read as plain data and fit a transformer of ``expected`` shapes; returns the located weights."""
    from sage_grpo.export.weights import locate_trained_weights

    try:
        located = locate_trained_weights(path)
        stored = stored_shapes(located)
    except (FileNotFoundError, ValueError) as err:  # CheckpointError is a ValueError
        raise CheckpointError(f"{option} {path}: {err}") from None
    problems = mismatches(stored, expected)
    if problems:
        raise CheckpointError(f"{option} {path}: the weights in {located} do not fit the transformer: "
                              + "; ".join(problems[:3]))
    return located


def _identity_files(path: Path, located: Path) -> Iterator[Path]:
    """Every file whose bytes determine the weights read from ``path``: the weights (a folder's files, a shard
    index and its shards) and, for a LoRA training checkpoint, the config its alpha comes from."""
    if located.is_dir():
        yield from sorted(p for p in located.rglob("*") if p.is_file())
    elif located.name.endswith(".index.json"):
        yield located
        yield from _index_shards(located)
    else:
        yield located
    for folder in (path, path.parent, path.parent.parent):
        if (folder / CONFIG_FILE).is_file() or (folder / LORA_DIR).is_dir():
            yield from (p for p in (folder / CONFIG_FILE, folder / LORA_DIR / lora_folder.ADAPTER_CONFIG_FILE)
                        if p.is_file())
            break


def weights_digest(path: PathLike) -> str:
    """SHA-256 (hex, 16 digits) of the names and every byte of the files the trained weights at ``path`` are read
    from (:func:`_identity_files`)."""
    from sage_grpo.export.weights import locate_trained_weights

    path = Path(path)
    located = locate_trained_weights(path)
    digest = hashlib.sha256()
    for file in _identity_files(path, located):
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]

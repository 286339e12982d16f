"""Trained transformer weights in every form they come in, and exporting them for diffusers and peft.

:func:`read_trained_weights` turns any accepted location into one :class:`TrainedWeights` (full weights, or a LoRA
adapter with its config):

    checkpoint-N/                     transformer/model.safetensors, else transformer_dcp/ (sharded DCP)
    checkpoint-N/transformer/         its model.safetensors (the trainable weights: all, or the LoRA adapter)
    checkpoint-N/transformer_dcp/     a torch.distributed.checkpoint folder (``.metadata``), keys of the unwrapped
                                      transformer, optionally nested under ``model`` as the reference saves them
    weights.safetensors               a single file (or a ``.safetensors.index.json`` of shards)
    exported/                         a diffusers transformer folder (``diffusion_pytorch_model*.safetensors``)
    adapter/                          a LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``)

A LoRA training checkpoint holds only adapter tensors; its config comes from ``checkpoint-N/lora/`` when present,
else from the run's ``config.yaml`` (alpha, dropout) with the rank and the adapted modules read off the tensors.

:func:`apply_trained_weights` loads them into a base transformer and, for LoRA, merges the adapter into the base
weights (W + alpha/r B A), giving a plain ``HunyuanVideo15Transformer3DModel``: the same thing generate.py samples
with and what :func:`export_checkpoint` saves.

Export (``scripts/export_checkpoint.py``):

* ``--format transformer``: a diffusers ``save_pretrained`` folder (config.json + safetensors), merged for LoRA runs,
  cast to ``--dtype`` (default fp32, lossless for the trained fp32 master weights). Load it with
  ``HunyuanVideo15Transformer3DModel.from_pretrained(folder)`` and pass it to ``HunyuanVideo15Pipeline``.
* ``--format lora`` (LoRA runs only): the peft adapter folder (see :mod:`sage_grpo.models.lora_folder` for the loading
  calls).
* ``--format pipeline``: the transformer folder as ``transformer/`` of a whole diffusers pipeline folder
  (:mod:`sage_grpo.export.pipeline`), which ``HunyuanVideo15Pipeline.from_pretrained`` loads.

Each gets a model card, ``README.md`` (:mod:`sage_grpo.export.model_card`): base, settings, the run's metrics.
"""

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from sage_grpo.models import lora, lora_folder
from sage_grpo.checkpoint_layout import CONFIG_FILE, DCP_DIR, DCP_MODEL, LORA_DIR, TRANSFORMER_FILE
from sage_grpo.dtypes import DTYPES
from sage_grpo.export.model_card import recorded_settings, write_model_card
from sage_grpo.models.loading import _read_safetensors, resolve_transformer_weights
from sage_grpo.safe_io import CheckpointError, check_finite, read_json_object

PathLike = Union[str, Path]
DCP_METADATA = ".metadata"
DCP_NESTING = f"{DCP_MODEL}."  # {"model": state_dict, ...} is stored flattened as model.<key>
EXPORT_FORMATS = ("transformer", "lora", "pipeline")


@dataclass
class TrainedWeights:
    """Weights to put into a base transformer: ``state`` is the full state dict, or the LoRA adapter (peft keys)."""

    kind: str  # "full" or "lora"
    state: Dict[str, torch.Tensor]
    source: Path
    lora_config: Optional[object] = None  # peft LoraConfig (kind == "lora")

    @property
    def is_lora(self) -> bool:
        return self.kind == "lora"


# ---------------------------------------------------------------------------------------------------- reading
def is_dcp_folder(path: Path) -> bool:
    return (Path(path) / DCP_METADATA).is_file()


def read_dcp_state_dict(folder: PathLike) -> Dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint as one unsharded state dict, in one process (no process group needed).

    When the checkpoint nests its parts (``{"model": ..., "optimizer": ..., "anchor": ...}``, as the reference and
    the sharded trainer save them), only ``model`` is read and its prefix dropped.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from sage_grpo.safe_io import dcp_load, read_dcp_metadata

    folder = Path(folder)
    metadata = read_dcp_metadata(folder)
    tensors = {k: m for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    nested = any(key.startswith(DCP_NESTING) for key in tensors)
    state = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype) for key, meta in tensors.items()
             if not nested or key.startswith(DCP_NESTING)}
    if not state:
        raise ValueError(f"{folder}: the DCP checkpoint holds no model tensors")
    with warnings.catch_warnings():  # "no process group: loading in this process alone" is expected here
        warnings.simplefilter("ignore")
        dcp_load(state, folder, allow_partial_load=True)
    return {key[len(DCP_NESTING):]: value for key, value in state.items()} if nested else state


def _checkpoint_dir_of(path: Path) -> Optional[Path]:
    """The ``checkpoint-N`` directory a weights location belongs to (for its lora/ folder and config.yaml)."""
    for candidate in (path, path.parent, path.parent.parent):
        if (candidate / CONFIG_FILE).is_file() or (candidate / LORA_DIR).is_dir():
            return candidate
    return None


def _locate(path: Path) -> Path:
    """The file, DCP folder or adapter folder holding the weights at ``path``."""
    if path.is_dir() and (lora_folder.is_adapter_folder(path) or is_dcp_folder(path)):
        return path
    if path.is_dir() and is_dcp_folder(path / DCP_DIR) and not (path / TRANSFORMER_FILE).is_file():
        return path / DCP_DIR
    try:
        return resolve_transformer_weights(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err} Also accepted: a torch.distributed.checkpoint folder (with {DCP_METADATA}), "
                                f"a checkpoint-N dir holding {DCP_DIR}/, or a LoRA adapter folder "
                                f"({lora_folder.ADAPTER_CONFIG_FILE} + {lora_folder.ADAPTER_WEIGHTS_FILE}).") from None


def locate_trained_weights(path: PathLike) -> Path:
    """The file or folder :func:`read_trained_weights` reads at ``path``, checked without reading any tensor (a
    LoRA folder must hold its safetensors weights); FileNotFoundError naming what is accepted otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    located = _locate(path)
    if lora_folder.is_adapter_folder(located) and not (located / lora_folder.ADAPTER_WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{located} is a LoRA adapter folder without {lora_folder.ADAPTER_WEIGHTS_FILE} "
                                f"(found: {', '.join(sorted(p.name for p in located.iterdir())[:10])}); only "
                                "safetensors weights are read. Save the adapter with peft's "
                                "save_pretrained(safe_serialization=True), or pass a checkpoint-N folder")
    if lora_folder.is_adapter_folder(located):
        lora_folder.check_adapter_folder(located)  # its adapter_config.json, before any model loads
    return located


def read_trained_weights(path: PathLike) -> TrainedWeights:
    """Read any accepted weights location (see the module docstring)."""
    path = Path(path)
    located = locate_trained_weights(path)
    if lora_folder.is_adapter_folder(located):
        config, state = lora_folder.read_adapter_folder(located)
        return TrainedWeights("lora", state, located, config)
    state = read_dcp_state_dict(located) if is_dcp_folder(located) else _read_safetensors(located)
    if not any(lora.is_adapter_key(key) for key in state):
        return TrainedWeights("full", state, located)
    state = lora.policy_adapter_state(state)
    return TrainedWeights("lora", state, located, lora_config_of_checkpoint(_checkpoint_dir_of(path), state))


def lora_config_of_checkpoint(checkpoint: Optional[Path], state: Dict[str, torch.Tensor]):
    """The LoraConfig of a LoRA training checkpoint: its lora/ folder, else its run config plus the tensors."""
    if checkpoint is not None and lora_folder.is_adapter_folder(checkpoint / LORA_DIR):
        return lora_folder.read_adapter_folder(checkpoint / LORA_DIR)[0]
    if checkpoint is None or not (checkpoint / CONFIG_FILE).is_file():
        raise FileNotFoundError("LoRA weights without their config: expected the checkpoint's lora/ folder or "
                                "config.yaml next to transformer/model.safetensors")
    from sage_grpo.config.train import read_run_config

    run = read_run_config(checkpoint / CONFIG_FILE)
    if run.lora.pretrained_lora_path and lora_folder.is_adapter_folder(Path(run.lora.pretrained_lora_path)):
        return lora_folder.read_adapter_folder(Path(run.lora.pretrained_lora_path))[0]
    modules = sorted({key.rsplit(".lora_", 1)[0] for key in state})
    rank = next(v.shape[0] for k, v in state.items() if k.endswith("lora_A.weight"))
    return lora.make_lora_config(rank, run.lora.lora_alpha, run.lora.lora_dropout, modules)


# ---------------------------------------------------------------------------------------------------- applying
def load_full_state(transformer: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> torch.nn.Module:
    """Copy a full state dict in; names and shapes must match exactly (one error lists every mismatch)."""
    expected = transformer.state_dict()
    problems = {
        "missing": sorted(set(expected) - set(state)),
        "unexpected": sorted(set(state) - set(expected)),
        "mis-shaped": sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape),
    }
    if any(problems.values()):
        lines = [f"{name} keys ({len(keys)}): {', '.join(keys[:10])}" for name, keys in problems.items() if keys]
        raise ValueError(f"Weights in {source} do not match the transformer:\n  " + "\n  ".join(lines))
    transformer.load_state_dict(state, strict=True)
    return transformer


def apply_trained_weights(transformer: torch.nn.Module, weights: TrainedWeights) -> torch.nn.Module:
    """Put ``weights`` into the base ``transformer`` (LoRA: inject, load strictly, merge); returns it."""
    if not weights.is_lora:
        return load_full_state(transformer, weights.state, str(weights.source))
    with lora.adapter_fits(weights.source):
        lora.add_adapter(transformer, weights.lora_config, lora.POLICY_ADAPTER)
        lora.load_adapter_state(transformer, weights.state, lora.POLICY_ADAPTER)
    return lora.merge_adapter(transformer, lora.POLICY_ADAPTER)


# ---------------------------------------------------------------------------------------------------- export
def check_export_output(output: Path, checkpoint: Path, model_root: Path) -> None:
    """``--output`` is a new or empty folder outside everything the export reads (before anything is written)."""
    from sage_grpo.safe_io import check_output_outside_inputs

    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; pass a new folder")
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"--output {output} exists and is not empty; choose a new folder")
    check_output_outside_inputs(output, "--output", {"--checkpoint": checkpoint, "--model_root": model_root})


def export_checkpoint(checkpoint: PathLike, model_root: PathLike, output: PathLike, *, export_format: str =
                      "transformer", dtype: str = "fp32", transformer_version: Optional[str] = None,
                      link_components: str = "symlink") -> Path:
    """Write ``output``: a diffusers transformer folder, (LoRA runs) a peft adapter folder, or a pipeline folder
    whose base components are linked or copied (``link_components``); returns it."""
    from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION
    from sage_grpo.models.loading import load_transformer

    if export_format not in EXPORT_FORMATS:
        raise ValueError(f"--format must be one of {EXPORT_FORMATS}, got {export_format!r}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    checkpoint, output = Path(checkpoint), Path(output)
    check_export_output(output, checkpoint, Path(model_root))
    run_config = recorded_settings(checkpoint)  # checked before anything is read or written
    weights = read_trained_weights(checkpoint)
    check_finite(weights.state, str(weights.source))  # NaN weights exported would be served as a model
    pipeline_record = None  # a pipeline export's sampling.json
    version = transformer_version or run_config.get("pretrained_transformer_version") or DEFAULT_TRANSFORMER_VERSION
    if export_format == "lora":
        if not weights.is_lora:
            raise ValueError(f"{checkpoint} holds full weights, not a LoRA adapter; use --format transformer")
        state = {k: v.to(DTYPES[dtype]) for k, v in weights.state.items()}
        lora_folder.write_adapter_folder(output, weights.lora_config, state)
    else:
        transformer = load_transformer(model_root, version, dtype=torch.float32, device="cpu")
        apply_trained_weights(transformer, weights)  # merged in fp32, then cast once
        if DTYPES[dtype] != torch.float32:
            transformer.to(DTYPES[dtype])
        if export_format == "pipeline":
            from sage_grpo.export.pipeline import write_pipeline_folder

            pipeline_record = write_pipeline_folder(model_root, version, output, run_config, link_components)
        transformer.save_pretrained(str(output / "transformer" if pipeline_record else output),
                                    safe_serialization=True)
    write_model_card(output, checkpoint, run_config=run_config, export_format=export_format, dtype=dtype,
                     merged_lora=weights.is_lora and export_format != "lora",
                     pipeline_record=pipeline_record, base_config=_base_config(model_root, version))
    return output


def _base_config(model_root: PathLike, version: str) -> Optional[dict]:
    """The config.json of the transformer the export starts from (None when the root has none or it is unreadable):
    the model card tells the released architecture from a tiny or toy one by it."""
    from sage_grpo.models.layout import transformer_layout

    try:
        return read_json_object(Path(model_root) / transformer_layout(version).subdir / "config.json", "the config")
    except CheckpointError:
        return None

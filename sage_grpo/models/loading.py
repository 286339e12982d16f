"""Load HunyuanVideo-1.5 components from a local checkpoint root, and trained transformer weights.

Nothing is fetched at run time: every ``from_pretrained`` call is ``local_files_only=True``, and the whole layout is
checked first (:mod:`sage_grpo.models.layout`), so a missing or partial download gives one
:class:`~sage_grpo.models.layout.MissingCheckpointError` that lists every missing file.

An image-to-video transformer version (``480p_i2v``, ...) brings the SigLIP image encoder and its processor
(``image_encoder/``, ``feature_extractor/``), frozen like the text encoders.

The frozen parts (VAE, both text encoders, the image encoder) are put in eval mode with ``requires_grad=False``; the
transformer is returned as ``from_pretrained`` gives it (eval mode, trainable), since the trainer decides what to
train.

A root holding ``checksums.json`` (the toy checkpoint) has every file it lists hashed before anything is read, and a
changed or damaged file is refused (:mod:`sage_grpo.models.checksums`).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from sage_grpo.checkpoint_layout import TRANSFORMER_FILE
from sage_grpo.models import layout
from sage_grpo.models.attention import install_joint_attention
from sage_grpo.models.checksums import verify_checksums
from sage_grpo.models.config_fields import check_component_configs
from sage_grpo.models.checksums import verify_checksums
from sage_grpo.safe_io import CheckpointError, read_json_object, shard_names

PathLike = Union[str, Path]


@dataclass
class HunyuanComponents:
    """The loaded pieces of a checkpoint root; parts not requested are None."""

    transformer: Optional[torch.nn.Module]
    vae: Optional[torch.nn.Module]
    text_encoder: Optional[torch.nn.Module]
    tokenizer: Optional[object]
    text_encoder_2: Optional[torch.nn.Module]
    tokenizer_2: Optional[object]
    scheduler_config: Dict
    transformer_version: str
    paths: Dict[str, Path] = field(default_factory=dict)
    image_encoder: Optional[torch.nn.Module] = None  # SiglipVisionModel (image-to-video versions)
    feature_extractor: Optional[object] = None  # its SiglipImageProcessor


def _freeze(module: torch.nn.Module) -> torch.nn.Module:
    module.eval()
    module.requires_grad_(False)
    return module


def load_transformer(model_root: PathLike = "./ckpts", version: str = layout.DEFAULT_TRANSFORMER_VERSION,
                     dtype: torch.dtype = torch.bfloat16, device: Union[str, torch.device] = "cpu"):
    """Load ``<root>/transformer/<version>`` alone (the trainer's KL reference is a second copy)."""
    root = Path(model_root)
    layout.check_transformer_version(root, version)
    layout.check_layout(root, [layout.transformer_layout(version)])
    check_component_configs(root, [layout.transformer_layout(version)])
    verify_checksums(root)  # a root with checksums.json (the toy checkpoint): every listed file as recorded
    return _read_transformer(root, version, dtype, device)


def _read_transformer(root: Path, version: str, dtype: torch.dtype, device: Union[str, torch.device]):
    from diffusers import HunyuanVideo15Transformer3DModel

    folder = root / layout.transformer_layout(version).subdir
    model = HunyuanVideo15Transformer3DModel.from_pretrained(folder, torch_dtype=dtype, local_files_only=True)
    install_joint_attention(model)  # trimmed text, no dense mask (attention.py); the backend can be changed later
    return model.to(device)


def load_components(model_root: PathLike = "./ckpts", transformer_version: str = layout.DEFAULT_TRANSFORMER_VERSION,
                    *, dtype: torch.dtype = torch.bfloat16, device: Union[str, torch.device] = "cpu",
                    load_transformer: bool = True, load_vae: bool = True,
                    load_text_encoders: bool = True, load_image_encoder: Optional[bool] = None,
                    text_encoder_device: Union[str, torch.device, None] = None) -> HunyuanComponents:
    """Load the requested components of ``model_root``; the scheduler config is always read. The text encoders and
    the image encoder go to ``text_encoder_device`` (default: ``device``). ``load_image_encoder`` None: with an
    image-to-video transformer version."""
    from diffusers import AutoencoderKLHunyuanVideo15
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, Qwen2Tokenizer, T5EncoderModel

    root = Path(model_root)
    if load_transformer:
        layout.check_transformer_version(root, transformer_version)
    versions = (transformer_version,) if load_transformer else ()
    if load_image_encoder is None:
        load_image_encoder = load_transformer and layout.version_task(transformer_version) == "i2v"
    layouts = layout.required_layouts(versions, text_encoders=load_text_encoders, vae=load_vae,
                                      image_encoder=load_image_encoder)
    layout.check_layout(root, layouts)
    check_component_configs(root, layouts)  # every config's structural fields, before any class is built from it
    verify_checksums(root)
    paths = {spec.name: root / spec.subdir for spec in layouts}

    def folder(spec: layout.ComponentLayout) -> Path:
        return root / spec.subdir

    components = HunyuanComponents(
        transformer=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        scheduler_config=read_json_object(folder(layout.SCHEDULER) / "scheduler_config.json", "the scheduler config"),
        transformer_version=transformer_version, paths=paths,
    )
    if load_transformer:
        components.transformer = _read_transformer(root, transformer_version, dtype, device)
    if load_vae:
        vae = AutoencoderKLHunyuanVideo15.from_pretrained(folder(layout.VAE), torch_dtype=dtype, local_files_only=True)
        components.vae = _freeze(vae.to(device))
    if load_text_encoders:
        components.tokenizer = Qwen2Tokenizer.from_pretrained(folder(layout.TOKENIZER), local_files_only=True)
        components.tokenizer_2 = ByT5Tokenizer.from_pretrained(folder(layout.TOKENIZER_2), local_files_only=True)
        text_encoder = Qwen2_5_VLTextModel.from_pretrained(folder(layout.TEXT_ENCODER), dtype=dtype,
                                                           local_files_only=True)
        text_encoder_2 = T5EncoderModel.from_pretrained(folder(layout.TEXT_ENCODER_2), dtype=dtype,
                                                        local_files_only=True)
        encoder_device = device if text_encoder_device is None else text_encoder_device
        components.text_encoder = _freeze(text_encoder.to(encoder_device))
        components.text_encoder_2 = _freeze(text_encoder_2.to(encoder_device))
    if load_image_encoder:
        components.image_encoder, components.feature_extractor = _read_image_encoder(
            root, dtype, device if text_encoder_device is None else text_encoder_device)
    return components


def _read_image_encoder(root: Path, dtype: torch.dtype, device: Union[str, torch.device]):
    """The SigLIP vision model (frozen) and its image processor."""
    from transformers import SiglipImageProcessor, SiglipVisionModel
    from transformers.utils import logging as hf_logging

    encoder = SiglipVisionModel.from_pretrained(root / layout.IMAGE_ENCODER.subdir, dtype=dtype,
                                                local_files_only=True)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # without torchvision: "falling back to SiglipImageProcessorPil" (the same op)
    try:
        processor = SiglipImageProcessor.from_pretrained(root / layout.FEATURE_EXTRACTOR.subdir,
                                                         local_files_only=True)
    finally:
        hf_logging.set_verbosity(level)
    return _freeze(encoder.to(device)), processor


def resolve_transformer_weights(path: PathLike) -> Path:
    """Map any accepted weights location to the file (or shard index) to read.

    Accepted: a ``.safetensors`` file; a training checkpoint dir ``checkpoint-N/`` (reads
    ``transformer/model.safetensors``) or its ``transformer/`` subdir (``model.safetensors``); a diffusers transformer
    folder (``diffusion_pytorch_model.safetensors`` or its ``.index.json``).
    """
    path = Path(path)
    if path.is_file():
        if path.name.endswith(".safetensors") or path.name.endswith(".safetensors.index.json"):
            return path
        raise ValueError(f"{path}: expected a .safetensors file (or a folder), got {path.suffix or 'no suffix'}")
    candidates = [
        path / TRANSFORMER_FILE,
        path / TRANSFORMER_FILE.name,
        path / "diffusion_pytorch_model.safetensors",
        path / "diffusion_pytorch_model.safetensors.index.json",
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"No transformer weights at {str(path)!r}. Expected one of: a .safetensors file; a training checkpoint dir "
        f"holding {TRANSFORMER_FILE}; its {TRANSFORMER_FILE.parent}/ subdir holding {TRANSFORMER_FILE.name}; or a "
        f"diffusers transformer folder holding diffusion_pytorch_model.safetensors(.index.json)."
    )


def _read_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file or sharded index; an unreadable file is named (CheckpointError)."""
    from safetensors.torch import load_file

    def read(file: Path) -> Dict[str, torch.Tensor]:
        try:
            return load_file(file)
        except Exception as err:  # SafetensorError, OSError
            raise CheckpointError(f"cannot read transformer weights {file}: {err} (truncated or not a safetensors "
                                  "file; download or copy it again)") from None

    if path.name.endswith(".index.json"):
        shards = shard_names(path)
        state: Dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(read(path.parent / shard))
        return state
    return read(path)


def load_transformer_weights(transformer: torch.nn.Module, path: PathLike) -> torch.nn.Module:
    """Copy weights from ``path`` (see :func:`resolve_transformer_weights`) into ``transformer``, strictly.

    Every key must match by name and shape; otherwise one ``ValueError`` lists the missing, unexpected and
    mis-shaped keys (first 10 of each). Values are cast to the model's dtype.
    """
    file = resolve_transformer_weights(path)
    state = _read_safetensors(file)
    expected = transformer.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mis_shaped = sorted(k for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or mis_shaped:
        def show(keys):
            return ", ".join(keys[:10]) + (f", ... ({len(keys)} in all)" if len(keys) > 10 else "")
        problems = [f"{name} keys: {show(keys)}" for name, keys in
                    (("missing", missing), ("unexpected", unexpected), ("mis-shaped", mis_shaped)) if keys]
        raise ValueError(f"Weights in {file} do not match the transformer:\n  " + "\n  ".join(problems))
    transformer.load_state_dict(state, strict=True)
    return transformer

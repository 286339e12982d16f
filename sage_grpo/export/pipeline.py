"""``export --format pipeline``: a folder diffusers' pipeline class loads as it is.

    <output>/model_index.json          HunyuanVideo15Pipeline (HunyuanVideo15ImageToVideoPipeline for an i2v version)
    <output>/transformer/              the trained transformer (save_pretrained, merged for LoRA runs)
    <output>/vae/ text_encoder/ tokenizer/ text_encoder_2/ tokenizer_2/ [image_encoder/ feature_extractor/]
                                       the base model's untouched components: absolute symlinks into --model_root
                                       (``--link_components symlink``, the default: no copy of the ~16 GB text
                                       encoder) or copies (``copy``: a self-contained folder to move or upload)
    <output>/scheduler/ guider/        the sampling configs generate.py would use for the version: its own
                                       ``variants/<version>/`` configs where the root has them, else the root's
                                       scheduler with the version's shift and a ClassifierFreeGuidance at 6.0
    <output>/sampling.json             what diffusers cannot read from a folder (below)

diffusers' HunyuanVideo-1.5 pipelines fix four prompt settings in ``__init__`` (text tokens 1000, byT5 tokens 256,
image tokens 729, template crop 108), not in any config. A run trained at other lengths (or a tiny test model, whose
tokenizer counts another template length) must set those attributes after ``from_pretrained``: the export records the
values in ``sampling.json`` and the model card prints the lines that set them (:func:`loading_code`).
"""

import json
import math
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from sage_grpo.models import layout
from sage_grpo.safe_io import read_json_object

PathLike = Union[str, Path]
LINK_MODES = ("symlink", "copy")
PIPELINE_CLASSES = {"t2v": "HunyuanVideo15Pipeline", "i2v": "HunyuanVideo15ImageToVideoPipeline"}
SAMPLING_FILE = "sampling.json"
GUIDER_DIR, SCHEDULER_DIR = "guider", "scheduler"
# The prompt attributes diffusers sets in the pipelines' __init__ (0.42.1), with their values there.
PIPELINE_PROMPT_DEFAULTS = {"tokenizer_max_length": 1000, "tokenizer_2_max_length": 256,
                            "vision_num_semantic_tokens": 729, "prompt_template_encode_start_idx": 108}
# library of each component class, as diffusers' model_index.json names it
_LIBRARY = {"HunyuanVideo15Transformer3DModel": "diffusers", "AutoencoderKLHunyuanVideo15": "diffusers",
            "FlowMatchEulerDiscreteScheduler": "diffusers", "ClassifierFreeGuidance": "diffusers"}


def pipeline_components(task: str) -> List[layout.ComponentLayout]:
    """The base components a pipeline of ``task`` ("t2v" or "i2v") takes unchanged from the model root."""
    return [layout.VAE, *layout.TEXT_COMPONENTS, *(layout.IMAGE_COMPONENTS if task == "i2v" else ())]


def model_index(task: str) -> Dict[str, Any]:
    """The ``model_index.json`` of a pipeline of ``task``: each component's [library, class]."""
    import diffusers

    entries = {"transformer": "HunyuanVideo15Transformer3DModel", "scheduler": "FlowMatchEulerDiscreteScheduler",
               "guider": "ClassifierFreeGuidance",
               **{component.subdir: component.class_name for component in pipeline_components(task)}}
    return {"_class_name": PIPELINE_CLASSES[task], "_diffusers_version": diffusers.__version__,
            **{name: [_LIBRARY.get(cls, "transformers"), cls] for name, cls in sorted(entries.items())}}


def prompt_settings(run_config: Mapping[str, Any], tokenizer_folder: Path) -> Dict[str, int]:
    """The four pipeline prompt attributes (:data:`PIPELINE_PROMPT_DEFAULTS`) for weights trained with
    ``run_config`` (the checkpoint's config.yaml; absent keys: the trainer's defaults), the crop counted with the
    model root's tokenizer."""
    from transformers import Qwen2Tokenizer

    from sage_grpo.models.text_encoding import count_template_tokens

    tokenizer = Qwen2Tokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    return {"tokenizer_max_length": run_config.get("text_max_length") or PIPELINE_PROMPT_DEFAULTS[
                "tokenizer_max_length"],
            "tokenizer_2_max_length": run_config.get("byt5_max_length", PIPELINE_PROMPT_DEFAULTS[
                "tokenizer_2_max_length"]),
            "vision_num_semantic_tokens": run_config.get("vision_num_semantic_tokens", PIPELINE_PROMPT_DEFAULTS[
                "vision_num_semantic_tokens"]),
            "prompt_template_encode_start_idx": count_template_tokens(tokenizer)}


def attribute_overrides(settings: Mapping[str, int]) -> Dict[str, int]:
    """The prompt attributes a loaded pipeline must be given: those that differ from diffusers' defaults."""
    return {name: value for name, value in settings.items() if PIPELINE_PROMPT_DEFAULTS.get(name) != value}


def apply_sampling_settings(pipe, folder: PathLike):
    """Set the attributes :func:`loading_code` prints on a pipeline loaded from an export ``folder`` (its
    ``sampling.json``, checked by :func:`read_sampling_record`)."""
    record = read_sampling_record(folder)
    if record is None:
        raise FileNotFoundError(f"{Path(folder) / SAMPLING_FILE} is missing: {folder} is not a sage-grpo pipeline "
                                "export")
    for name, value in attribute_overrides(record["pipeline_attributes"]).items():
        setattr(pipe, name, value)
    return pipe


def loading_code(task: str, overrides: Mapping[str, int]) -> str:
    """The Python lines that load the export (the model card shows them)."""
    lines = ["import torch", f"from diffusers import {PIPELINE_CLASSES[task]}",
             f'pipe = {PIPELINE_CLASSES[task]}.from_pretrained("<this folder>", dtype=torch.bfloat16)']
    if overrides:
        lines.append("# trained at prompt settings other than the pipeline's fixed defaults (see sampling.json):")
        lines += [f"pipe.{name} = {value}" for name, value in overrides.items()]
    return "\n".join(lines)


def _place(source: Path, target: Path, link_components: str) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: the model root has no {source.name}/ to put into the pipeline. "
                                f"{layout.DOWNLOAD_HINT}")
    if link_components == "symlink":
        target.symlink_to(source.resolve(), target_is_directory=True)
    else:
        shutil.copytree(source, target, symlinks=False)  # the root's links into .hf/ become real files


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_sampling_configs(model_root: Path, version: str, output: Path) -> Dict[str, float]:
    """``scheduler/`` and ``guider/`` of ``output``: what generate.py samples ``version`` with by default."""
    from sage_grpo.config.generate import DEFAULT_GUIDANCE_SCALE
    from sage_grpo.models.variants import resolve_generation_sampling

    guidance, shift, _, _ = resolve_generation_sampling(model_root, version, DEFAULT_GUIDANCE_SCALE, False, None)
    guider_file, scheduler_file = layout.variant_config_files(model_root, version)
    if not scheduler_file.is_file():
        scheduler_file = model_root / layout.SCHEDULER.subdir / layout.SCHEDULER_CONFIG
    scheduler = {**read_json_object(scheduler_file, "the scheduler config"), "shift": shift}
    _write_json(output / SCHEDULER_DIR / layout.SCHEDULER_CONFIG, scheduler)
    if guider_file.is_file():  # the authors' own guider, as they ship it (enabled flags, formulation)
        _write_json(output / GUIDER_DIR / layout.GUIDER_CONFIG, read_json_object(guider_file, "the guider config"))
    else:
        _write_json(output / GUIDER_DIR / layout.GUIDER_CONFIG,
                    {"_class_name": "ClassifierFreeGuidance", "guidance_scale": guidance})
    return {"guidance_scale": guidance, "flow_shift": shift}


def write_pipeline_folder(model_root: PathLike, version: str, output: PathLike, run_config: Mapping[str, Any],
                          link_components: str = "symlink") -> Dict[str, Any]:
    """Everything of the pipeline folder but ``transformer/`` (the caller saves the trained one there); returns the
    recorded sampling settings."""
    if link_components not in LINK_MODES:
        raise ValueError(f"--link_components must be one of {LINK_MODES}, got {link_components!r}")
    model_root, output = Path(model_root), Path(output)
    task = layout.version_task(version)
    output.mkdir(parents=True, exist_ok=True)
    for component in pipeline_components(task):
        _place(model_root / component.subdir, output / component.subdir, link_components)
    sampling = write_sampling_configs(model_root, version, output)
    record = {"transformer_version": version, "task": task, **sampling,
              "pipeline_attributes": prompt_settings(run_config, model_root / layout.TOKENIZER.subdir),
              "components": link_components}
    _write_json(output / SAMPLING_FILE, record)
    _write_json(output / "model_index.json", model_index(task))
    return record


MAX_RECORD_BYTES = 1 << 20  # a sampling.json is a few hundred bytes


def read_sampling_record(folder: PathLike) -> Optional[Dict[str, Any]]:
    """The ``sampling.json`` of a pipeline export (None for any other folder), checked like the flags it records:
    the four prompt attributes integers in [1, MAX_TOKENS], guidance and shift finite numbers, a known task; a
    ValueError naming the file and the key otherwise (the values are set on a pipeline and printed in a card)."""
    from sage_grpo.config.validation import MAX_TOKENS

    path = Path(folder) / SAMPLING_FILE
    if not path.is_file():
        return None
    record = read_json_object(path, "the sampling record", "export the pipeline again", error=ValueError,
                              max_bytes=MAX_RECORD_BYTES)
    attributes = record.get("pipeline_attributes")
    if not isinstance(attributes, dict):
        raise ValueError(f"{path}: expected a JSON object with 'pipeline_attributes'")
    for name, value in attributes.items():
        if name not in PIPELINE_PROMPT_DEFAULTS:
            raise ValueError(f"{path}: pipeline_attributes holds {name!r:.60}, not one of "
                             f"{sorted(PIPELINE_PROMPT_DEFAULTS)}")
        if type(value) is not int or not 1 <= value <= MAX_TOKENS:
            raise ValueError(f"{path}: pipeline_attributes.{name} must be an integer in [1, {MAX_TOKENS}], got "
                             f"{str(value)[:60]!r}")
    for name in ("guidance_scale", "flow_shift"):
        value = record.get(name)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ValueError(f"{path}: {name} must be a finite number, got {str(value)[:60]!r}")
    if record.get("task") not in PIPELINE_CLASSES:
        raise ValueError(f"{path}: task must be one of {sorted(PIPELINE_CLASSES)}, got "
                         f"{str(record.get('task'))[:60]!r}")
    return record

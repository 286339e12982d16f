"""The structural fields of every model config the project reads, one table per component, checked when the file is
read (:func:`read_model_config`), before anything is built from it.

A model class builds its shapes from its config's integers (layers, heads, head and patch sizes, channels, compression
ratios): a string where a number belongs, a patch size of 0 or a compression ratio of -16 ended in a traceback inside
diffusers or transformers, and a transformer of 200,000 layers was built for minutes, gigabytes of modules, before
anything looked at it. Each table names the fields its class builds shapes from, with what each must be: an integer
>= 1, a layer count of at most :data:`MAX_LAYERS`, a power of 2, a finite number > 0, ... A field the file leaves out
is the class's default and is not checked; a bad one is one :class:`~sage_grpo.safe_io.CheckpointError` line naming
the file, the field, the value and what is expected. Rules between fields that the classes rely on are checked too
(:func:`_cross_rules`). Whether the weights fit the machine is the memory planner's question
(:mod:`sage_grpo.plan.fit`), asked once these pass.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from sage_grpo.config.schema import shorten
from sage_grpo.safe_io import CheckpointError, read_json_object

MAX_LAYERS = 1024  # the released models have 54, 28, 12 and 32 layers; far more is a typo or a bomb
MAX_LIST = 16  # entries of a per-stage list (the VAE's block_out_channels: 5)
FIX = "download or copy the model folder again (bash download_weights.sh)"


@dataclass(frozen=True)
class Spec:
    """What one field must be: ``kind`` "int" (an integer >= 1, at most ``high``, a power of 2 if so marked),
    "ints" (a list of 1 to :data:`MAX_LIST` such integers), "number" (a finite number > 0), "fraction" (a finite
    number in [0, 1)) or "finite" (any finite number); ``nullable``: null means the class's default."""

    kind: str = "int"
    high: Optional[int] = None
    power_of_two: bool = False
    nullable: bool = False

    def problem(self, value: Any) -> Optional[str]:
        """What is wrong with ``value`` (None: nothing)."""
        if value is None and self.nullable:
            return None
        if self.kind == "ints":
            ok = isinstance(value, (list, tuple)) and 1 <= len(value) <= MAX_LIST and all(_integer(v, 1) for v in value)
            return None if ok else f"a list of 1 to {MAX_LIST} integers >= 1"
        if self.kind == "int":
            ok = _integer(value, 1) and (self.high is None or value <= self.high)
            ok = ok and (not self.power_of_two or value & (value - 1) == 0)
            return None if ok else ("a power of 2 (1, 2, 4, ...)" if self.power_of_two else
                                    f"an integer in [1, {self.high}]" if self.high else "an integer >= 1")
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if self.kind == "number":
            return None if number and value > 0 else "a finite number > 0"
        if self.kind == "fraction":
            return None if number and 0 <= value < 1 else "a finite number in [0, 1)"
        return None if number else "a finite number"


def _integer(value: Any, low: int) -> bool:
    return type(value) is int and value >= low


COUNT, LAYERS, POW2 = Spec(), Spec(high=MAX_LAYERS), Spec(power_of_two=True)
POSITIVE, INTS = Spec("number"), Spec("ints")

# HunyuanVideo15Transformer3DModel
TRANSFORMER = {"in_channels": COUNT, "out_channels": Spec(nullable=True), "num_attention_heads": COUNT,
               "attention_head_dim": COUNT, "num_layers": LAYERS, "num_refiner_layers": LAYERS, "mlp_ratio": POSITIVE,
               "patch_size": COUNT, "patch_size_t": COUNT, "text_embed_dim": COUNT, "text_embed_2_dim": COUNT,
               "image_embed_dim": COUNT, "rope_theta": POSITIVE, "rope_axes_dim": INTS, "target_size": COUNT}
# AutoencoderKLHunyuanVideo15
VAE = {"in_channels": COUNT, "out_channels": COUNT, "latent_channels": COUNT, "block_out_channels": INTS,
       "layers_per_block": LAYERS, "spatial_compression_ratio": POW2, "temporal_compression_ratio": POW2,
       "scaling_factor": POSITIVE}
# Qwen2.5-VL's text model (the MLLM text encoder) and Qwen2-VL's language model (VideoAlign's base): the text fields
# at the top (a text model's file, older files) or in text_config (a whole VL model's)
_QWEN_TEXT = {"vocab_size": COUNT, "hidden_size": COUNT, "intermediate_size": COUNT, "num_hidden_layers": LAYERS,
              "num_attention_heads": COUNT, "num_key_value_heads": Spec(nullable=True)}
TEXT_ENCODER = {f"{prefix}{name}": spec for prefix in ("", "text_config.") for name, spec in _QWEN_TEXT.items()}
# T5EncoderModel (byT5)
BYT5 = {"vocab_size": COUNT, "d_model": COUNT, "d_kv": COUNT, "d_ff": COUNT, "num_layers": LAYERS,
        "num_decoder_layers": Spec(high=MAX_LAYERS, nullable=True), "num_heads": COUNT,
        "relative_attention_num_buckets": COUNT, "relative_attention_max_distance": COUNT}
# SiglipVisionModel (image-to-video)
IMAGE_ENCODER = {"hidden_size": COUNT, "intermediate_size": COUNT, "num_hidden_layers": LAYERS,
                 "num_attention_heads": COUNT, "num_channels": COUNT, "image_size": COUNT, "patch_size": COUNT}
# Qwen2VLForConditionalGeneration, VideoAlign's base model
REWARD_BASE = {**TEXT_ENCODER,
               **{f"vision_config.{name}": spec for name, spec in (
                   ("depth", LAYERS), ("embed_dim", COUNT), ("hidden_size", COUNT), ("num_heads", COUNT),
                   ("mlp_ratio", POSITIVE), ("patch_size", COUNT), ("spatial_merge_size", COUNT),
                   ("temporal_patch_size", COUNT), ("in_channels", COUNT), ("in_chans", COUNT))}}
# VideoAlign's model_config.json: what the reward model and its frame sampling are built from
VIDEOALIGN = {"data_config.max_frame_pixels": COUNT, "data_config.fps": Spec("number", nullable=True),
              "data_config.num_frames": Spec(nullable=True), "model_config.output_dim": COUNT,
              "peft_lora_config.lora_r": COUNT, "peft_lora_config.lora_alpha": POSITIVE,
              "peft_lora_config.lora_dropout": Spec("fraction"),
              **{f"inference_config.{m}_{s}": Spec("number" if s == "std" else "finite")
                 for m in ("VQ", "MQ", "TA") for s in ("mean", "std")}}

TABLES: Dict[str, Dict[str, Spec]] = {
    "transformer": TRANSFORMER, "vae": VAE, "text_encoder": TEXT_ENCODER, "text_encoder_2": BYT5,
    "image_encoder": IMAGE_ENCODER, "reward_base": REWARD_BASE, "videoalign": VIDEOALIGN}
WHAT = {"transformer": "the transformer config", "vae": "the VAE config", "text_encoder": "the text encoder config",
        "text_encoder_2": "the byT5 encoder config", "image_encoder": "the image encoder config",
        "reward_base": "VideoAlign's base model config", "videoalign": "the VideoAlign config"}


def _lookup(data: Dict, key: str, path: Path, error: type):
    """``data[key]`` along a dotted key; ``(False, None)`` when a level is absent."""
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if depth and not isinstance(data, dict):
            raise error(f"{path}: {'.'.join(parts[:depth])} must be a JSON object, got {shorten(data)}; {FIX}")
        if part not in data:
            return False, None
        data = data[part]
    return True, data


def check_config(data: Dict, component: str, path, error: type = CheckpointError) -> Dict:
    """``data`` (the config ``component`` read from ``path``), every structural field checked; returned as is."""
    for key, spec in TABLES[component].items():
        present, value = _lookup(data, key, Path(path), error)
        expected = spec.problem(value) if present else None
        if expected:
            raise error(f"{path}: {key} {shorten(value)} must be {expected} ({WHAT[component]}); {FIX}")
    problem = _cross_rules(data, component)
    if problem:
        raise error(f"{path}: {problem} ({WHAT[component]}); {FIX}")
    return data


def _cross_rules(data: Dict, component: str) -> Optional[str]:
    """The rules between fields that the classes build on (the fields themselves are checked already)."""
    if component == "transformer":
        rope, head_dim = data.get("rope_axes_dim", [16, 56, 56]), data.get("attention_head_dim", 128)
        if len(rope) != 3 or any(dim % 2 for dim in rope) or sum(rope) != head_dim:
            return (f"rope_axes_dim {rope} must be 3 even sizes (frames, height, width) summing to "
                    f"attention_head_dim {head_dim}")
    if component == "vae":
        spatial, temporal = data.get("spatial_compression_ratio", 16), data.get("temporal_compression_ratio", 4)
        channels, latent = data.get("block_out_channels", [128, 256, 512, 1024, 1024]), data.get("latent_channels", 32)
        matched = data.get("downsample_match_channel", True) or data.get("upsample_match_channel", True)
        stages = len(channels) - 1 if matched else len(channels)  # a matched stage reads the next one's channels
        if temporal > spatial:
            return (f"temporal_compression_ratio {temporal} must be at most spatial_compression_ratio {spatial} (the "
                    "frames are compressed in the spatial stages)")
        if spatial > 2 ** stages:
            return (f"spatial_compression_ratio {spatial} needs {int(math.log2(spatial))} downsampling stages, but "
                    f"block_out_channels {channels} gives {stages}")
        if channels[-1] % (2 * latent):
            return (f"block_out_channels[-1] {channels[-1]} must be a multiple of 2 x latent_channels {latent} (the "
                    "encoder's output and the decoder's input are grouped by it)")
    return None


def read_model_config(path, component: str, error: type = CheckpointError) -> Dict:
    """The config ``component`` at ``path`` (``safe_io.read_json_object``), its structural fields checked."""
    return check_config(read_json_object(path, WHAT[component], error=error), component, path, error)


def component_of(layout_name: str) -> Optional[str]:
    """The table of a :class:`~sage_grpo.models.layout.ComponentLayout` (by its name), None for one without."""
    name = layout_name.split(" ")[0]  # "transformer (480p_t2v)" -> "transformer"
    return name if name in TABLES else None


def check_component_configs(root, layouts: Sequence) -> None:
    """Every ``config.json`` of ``layouts`` under ``root`` that has a table and exists, checked (a missing one is
    the layout check's to report)."""
    for component in layouts:
        table = component_of(component.name)
        config = Path(root) / component.subdir / "config.json"
        if table is not None and config.is_file():
            read_model_config(config, table)

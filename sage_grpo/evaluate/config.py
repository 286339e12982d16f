"""``EvaluateConfig``: the options of ``python -m sage_grpo.evaluate``, declared once.

The sampling options keep ``generate.py``'s names and meanings (sage_grpo/config/generate.py) and are handed to it
unchanged, except the default number of steps: 40, what the paper's user study samples with (``generate.py``'s 50
is the reference's). Every (checkpoint, prompt, seed) is sampled with the same settings, written once to
``results.json``.
"""

from dataclasses import dataclass
from typing import List, Optional

from sage_grpo.config.bounds import AT_LEAST_1, POSITIVE, SEED, TOKENS, Bound
from sage_grpo.config.schema import config_field
from sage_grpo.config.train import ATTENTION_BACKENDS, DEFAULT_CLIP_MODEL, PICKSCORE_MODEL, PICKSCORE_PROCESSOR

DEFAULT_METRICS = "videoalign,clipscore,pickscore"
PAPER_SAMPLING_STEPS = 40  # the paper's user study


@dataclass
class EvaluateConfig:
    HELP_GROUPS = (  # --help's topic groups, in order; each option names its own (group=...)
        ("what to evaluate", "checkpoints, prompts, seeds, metrics and the output folder"),
        ("scorer models", "where the scorers' weights are"),
        ("sampling", "generate.py's settings, the same for every checkpoint"),
        ("pictures", "the side-by-side frames"),
    )
    # ---------------------------------------------------------------- what to evaluate
    checkpoints: Optional[List[str]] = config_field(
        None, "Models to compare, each 'base' (the --model_path transformer) or trained weights generate.py's "
        "--checkpoint_path takes: a checkpoint-N dir (full, LoRA or sharded), an exported folder, a LoRA adapter "
        "folder, a .safetensors file", nargs="+", group="what to evaluate")
    prompts: Optional[str] = config_field(
        None, "CSV with a 'prompt' column (its seed column is not used: --seeds)", group="what to evaluate")
    seeds: List[int] = config_field(
        [0, 1], "Seeds: every prompt is sampled once per seed", nargs="+", group="what to evaluate", bound=SEED)
    metrics: str = config_field(
        DEFAULT_METRICS, "Comma-separated: videoalign (VQ, MQ, TA, Overall), clipscore, pickscore, or any reward "
        "name the project knows (brightness, target_color, toy_red, ..., a @reward_plugin dotted path)",
        group="what to evaluate")
    reward_weights: Optional[str] = config_field(
        None, "VideoAlign weights of the extra 'weighted' column, JSON, e.g. '{\"VQ\":0.5,\"MQ\":0.5,\"TA\":1.0}' "
        "(default: the reference's alignment default, which this is)", group="what to evaluate")
    output: str = config_field(
        "eval", "Output folder: results.json, results.md, bars.png, side_by_side/, cache/", group="what to evaluate")
    # ---------------------------------------------------------------- scorer models
    model_path: str = config_field(
        "./ckpts", "Checkpoint root: HunyuanVideo-1.5, VideoReward and the scorers", group="scorer models")
    clip_model: str = config_field(
        DEFAULT_CLIP_MODEL, "CLIPScore's model: a local CLIP folder, or a hub name found as <model_path>/<name>",
        group="scorer models")
    pickscore_model: str = config_field(
        PICKSCORE_MODEL, "PickScore's model (folder, or <model_path>/<name>)", group="scorer models")
    pickscore_processor: str = config_field(
        PICKSCORE_PROCESSOR, "PickScore's processor (folder or name)", group="scorer models")
    # ---------------------------------------------------------------- sampling (generate.py's meanings)
    num_inference_steps: int = config_field(
        PAPER_SAMPLING_STEPS, "Euler (ODE) denoising steps (paper: 40)", group="sampling", bound=AT_LEAST_1)
    resolution: str = config_field("480p", "Transformer version <resolution>_t2v and the video size",
                                   choices=("480p", "720p"), group="sampling")
    model_version: Optional[str] = config_field(
        None, "Transformer version folder (default <resolution>_t2v)", group="sampling")
    video_length: int = config_field(121, "Frames per video (1 + a multiple of 4)", group="sampling", bound=AT_LEAST_1)
    aspect_ratio: str = config_field("16:9", "Width:height when --fixed_size is not given", group="sampling")
    fixed_size: Optional[str] = config_field(None, "HEIGHTxWIDTH of the videos, e.g. 480x848", group="sampling")
    guidance_scale: Optional[float] = config_field(
        None, "CFG scale (default: the version's guider config, else 6)", group="sampling", bound=POSITIVE)
    flow_shift: Optional[float] = config_field(
        None, "Sigma shift (default: the version's scheduler config)", group="sampling", bound=POSITIVE)
    negative_prompt: str = config_field("", "Negative prompt of classifier-free guidance", group="sampling")
    text_max_length: Optional[int] = config_field(
        None, "MLLM text token length (generate.py's --text_max_length)", group="sampling", bound=TOKENS)
    byt5_max_length: int = config_field(256, "byT5 token length", group="sampling", bound=TOKENS)
    vision_num_semantic_tokens: int = config_field(
        729, "Image-embedding tokens (zeros, t2v)", group="sampling", bound=TOKENS)
    dtype: str = config_field("bf16", "Dtype the video model runs in (the scorers run in fp32)",
                              choices=("bf16", "fp32"), group="sampling")
    attention_backend: str = config_field(
        "native", "diffusers attention backend", choices=ATTENTION_BACKENDS, group="sampling")
    offloading: bool = config_field(
        True, "Move each model to CUDA only for its stage (as generate.py)", group="sampling")
    device: Optional[str] = config_field(
        None, "Torch device (default: this rank's CUDA device, else cpu)", group="sampling")
    # ---------------------------------------------------------------- pictures
    picture_frames: int = config_field(
        4, "Frames per row of the side-by-side pictures (evenly spaced)", group="pictures", bound=AT_LEAST_1)
    picture_height: int = config_field(
        128, "Frame height in the side-by-side pictures, in pixels", group="pictures", bound=Bound(8, fix="use 128"))

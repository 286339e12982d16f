"""``GenerateConfig``: the options of ``generate.py`` (docs/reference.md#sampling-script-flags), declared once.

Core reference flags keep their names and defaults (``--num_inference_steps 50``, ``--video_length 121``,
``--seed 930``, ``--aspect_ratio 16:9``, ``--dtype bf16``, ``--offloading true``, ...); ``--guidance_scale``,
``--flow_shift`` and ``--device`` are new (the reference takes CFG and shift from its pipeline config; their defaults
are that config's: CFG 6.0, shift 5.0 at 480p and 9.0 at 720p), as are the text-stream lengths, which must match what
the weights were trained with (the trainer has the same three flags). With ``--checkpoint_path`` a training checkpoint,
the settings its run recorded (token lengths, transformer version, guidance) are the defaults
(sage_grpo/pipeline/recorded.py); a flag that overrides one is named in a note.

Inference-speed flags map onto diffusers (sage_grpo/pipeline/generation.py): ``--offloading`` moves each model to
CUDA only for its stage, ``--group_offloading`` is diffusers' block-level ``apply_group_offloading`` on the
transformer blocks, ``--enable_torch_compile`` compiles the repeated blocks, ``--use_sageattn`` selects diffusers'
``sage_varlen`` attention backend on ``--sage_blocks_range``, ``--enable_cache`` is diffusers' TaylorSeer cache.
Flags of features this reimplementation does not have (super-resolution, prompt rewrite, step distillation, sparse
attention, the angelslim fp8 path) are accepted with a warning.

The transformer version is ``<resolution>_t2v``, ``<resolution>_t2v_distilled`` with ``--cfg_distilled`` (the
reference's naming; ``_i2v`` instead of ``_t2v`` with a reference image: ``--image_path`` or a CSV ``ref_image_path``
column), or any folder under ``<model_path>/transformer/`` named by ``--model_version``. Unset guidance and
shift follow that version's own guider and scheduler configs (sage_grpo/models/variants.py): a cfg-distilled version
samples without CFG; an explicit ``--guidance_scale`` or ``--flow_shift`` that contradicts them is used with a warning.

Departures: ``--resolution`` and ``--model_path`` have defaults (480p, ./ckpts) instead of being required, and
``--valid_video_csv`` has none (the reference's default CSV is not shipped, docs/reference.md#d24).
"""

from dataclasses import dataclass
from typing import List, Optional

from sage_grpo.config.bounds import AT_LEAST_1, NON_NEGATIVE, POSITIVE, SEED, TOKENS
from sage_grpo.config.schema import config_field
from sage_grpo.config.train import ATTENTION_BACKENDS

DEFAULT_GUIDANCE_SCALE = 6.0  # the reference's CFG: the guidance of a version without a guider config
_NOT_IMPLEMENTED = "this feature of the reference's inference stack is not reimplemented"


@dataclass
class GenerateConfig:
    HELP_GROUPS = (  # --help's topic groups, in order; each option names its own (group=...)
        ("prompts", "what to render"),
        ("model", "the checkpoint root, the transformer version and the trained weights"),
        ("sampling", "the ODE sampler and the video size"),
        ("output", "where the videos go"),
        ("speed and memory", "offloading, compilation, attention kernels and the feature cache (CUDA)"),
        ("reference flags without effect", "features of the reference's inference stack that are not reimplemented"),
    )
    # ---------------------------------------------------------------- prompts
    prompt: Optional[str] = config_field(
        None, "Prompt to render; used only when --valid_video_csv yields no prompts", group="prompts")
    valid_video_csv: Optional[List[str]] = config_field(
        None, "CSV file(s) with a 'prompt' column and optional 'seed' and 'ref_image_path' (image-to-video; relative "
        "to the CSV) columns; take priority over --prompt", nargs="+", group="prompts")
    image_path: Optional[str] = config_field(
        None, "Reference image: image-to-video with the <resolution>_i2v transformer, for --prompt and for CSV rows "
        "without their own ref_image_path ('none': text-to-video)", group="prompts")
    negative_prompt: str = config_field("", "Negative prompt of classifier-free guidance", group="prompts")
    seed: int = config_field(930, "Seed of --prompt, and of CSV rows without a seed", group="prompts", bound=SEED)
    # ---------------------------------------------------------------- model
    model_path: str = config_field("./ckpts", "Checkpoint root (see ckpts/README.md)", group="model")
    resolution: str = config_field("480p", "Selects the transformer version <resolution>_t2v and the video size",
                                   choices=("480p", "720p"), group="model")
    cfg_distilled: bool = config_field(
        False, "Use the cfg-distilled transformer <resolution>_t2v_distilled (sampled with its own guidance, 1.0)",
        group="model")
    model_version: Optional[str] = config_field(
        None, "Transformer version folder under <model_path>/transformer/ (default: from --resolution and "
        "--cfg_distilled), e.g. 480p_t2v_distilled", group="model")
    checkpoint_path: Optional[str] = config_field(
        None, "Trained weights: a training checkpoint-N dir (full, LoRA, or sharded transformer_dcp/), its "
        "transformer/ subdir, a DCP folder, a .safetensors file, or an exported diffusers transformer folder",
        group="model")
    lora_path: Optional[str] = config_field(
        None, "LoRA adapter folder (peft format: checkpoint-N/lora or an export --format lora), merged into the "
        "transformer after --checkpoint_path", group="model")
    dtype: str = config_field("bf16", "Dtype the models run in", choices=("bf16", "fp32"), group="model")
    attention_backend: str = config_field(
        "native", "diffusers attention backend of the transformer (native = torch SDPA; flash, flash_varlen, sage, "
        "... where installed)", choices=ATTENTION_BACKENDS, group="model")
    device: Optional[str] = config_field(None, "Torch device; default cuda when available, else cpu", group="model")
    # ---------------------------------------------------------------- sampling
    num_inference_steps: int = config_field(50, "Euler (ODE) denoising steps", group="sampling", bound=AT_LEAST_1)
    video_length: int = config_field(
        121, "Frames per video (1 + a multiple of the VAE's temporal ratio, 4)", group="sampling", bound=AT_LEAST_1)
    aspect_ratio: str = config_field(
        "16:9", "Width:height of the video when --fixed_size is not given", group="sampling")
    fixed_size: Optional[str] = config_field(None, "HEIGHTxWIDTH override of the size, e.g. 480x864", group="sampling")
    guidance_scale: Optional[float] = config_field(
        None, "Classifier-free guidance scale s: v = v_u + s*(v_c - v_u); s <= 1: no guidance (v = v_c). Unset: the "
        "--checkpoint_path run's --cfg_scale, else the version's guider config (cfg-distilled: 1.0), else 6.0",
        group="sampling", bound=POSITIVE)
    flow_shift: Optional[float] = config_field(
        None, "Time shift s of the sigma schedule, sigma = s*u / (1 + (s-1)*u); default: the version's scheduler "
        "config, else the reference's for the version (480p 5.0, 720p 9.0)", group="sampling", bound=POSITIVE)
    text_max_length: Optional[int] = config_field(
        None, "MLLM text token length (default: what the --checkpoint_path run was trained with, else the pipeline's "
        "1000)", group="model", bound=TOKENS)
    byt5_max_length: int = config_field(
        256, "byT5 glyph-stream token length (default: the --checkpoint_path run's)", group="model", bound=TOKENS)
    vision_num_semantic_tokens: int = config_field(
        729, "Image-embedding tokens fed to the transformer (zeros, t2v; default: the --checkpoint_path run's)",
        group="model", bound=TOKENS)
    # ---------------------------------------------------------------- output
    output_path: Optional[str] = config_field(
        None, "A .mp4 path: one video is written there, several to the folder of that path without .mp4; an "
        "existing folder, a path ending in /, or a path without extension: a folder, for any number of videos. A "
        "folder holds sample_{i:03d}_seed_{seed}_{prompt}.mp4 files; another extension is refused (videos are mp4); "
        "files of the same names are replaced (named first). Default ./outputs/output_<version>_<time>.mp4",
        group="output")
    save_generation_config: bool = config_field(
        True, "Also write <name>_config.json next to each video", group="output")
    # ---------------------------------------------------------------- inference speed and memory (CUDA)
    offloading: bool = config_field(
        True, "Keep the models on the CPU and move each to CUDA only for its stage (encode, denoise, decode)",
        group="speed and memory")
    group_offloading: Optional[bool] = config_field(
        None, "Block-level group offloading of the transformer blocks (diffusers apply_group_offloading); "
        "unset: on when the GPU has less than 60 GB", group="speed and memory")
    overlap_group_offloading: bool = config_field(
        True, "Overlap group-offloading transfers with compute",
        no_effect="transfers are synchronous: diffusers' stream prefetching needs its hooks on the whole "
        "transformer, whose input layers the sampler takes its device from", group="speed and memory")
    enable_torch_compile: bool = config_field(
        False, "torch.compile each repeated transformer block", group="speed and memory")
    use_sageattn: bool = config_field(
        False, "SageAttention (diffusers backend sage_varlen; needs the sageattention package, CUDA and bf16)",
        group="speed and memory")
    sage_blocks_range: str = config_field(
        "0-53", "Transformer blocks that use SageAttention: 'a-b' or 'a,b,c'", group="speed and memory")
    enable_cache: bool = config_field(
        False, "Feature cache across denoising steps (diffusers TaylorSeer cache)", group="speed and memory")
    cache_type: str = config_field(
        "deepcache", "deepcache: reuse the cached attention outputs on skipped steps (TaylorSeer order 0); "
        "taylorcache: first-order Taylor extrapolation (order 1)", choices=("deepcache", "teacache", "taylorcache"),
        group="speed and memory")
    no_cache_block_id: str = config_field(
        "53", "Blocks (comma-separated) always computed in full with --enable_cache", group="speed and memory")
    cache_start_step: int = config_field(
        11, "First denoising step that may reuse the cache", group="speed and memory", bound=NON_NEGATIVE)
    cache_end_step: int = config_field(
        45, "Denoising step from which every step is computed in full again", group="speed and memory",
        bound=NON_NEGATIVE)
    total_steps: int = config_field(
        50, "Cache schedule length", no_effect="the TaylorSeer cache counts steps itself", group="speed and memory",
        bound="no effect (the TaylorSeer cache counts steps itself)")
    cache_step_interval: int = config_field(
        4, "Steps between full computations while caching", group="speed and memory", bound=AT_LEAST_1)
    # ---------------------------------------------------------------- accepted for compatibility
    sr: bool = config_field(
        True, "Super-resolution pipeline", no_effect=_NOT_IMPLEMENTED, group="reference flags without effect")
    save_pre_sr_video: bool = config_field(
        False, "Also save the pre-SR video", no_effect=_NOT_IMPLEMENTED, group="reference flags without effect")
    rewrite: bool = config_field(False, "Prompt rewrite through a vLLM server", no_effect=_NOT_IMPLEMENTED,
        group="reference flags without effect")
    enable_step_distill: bool = config_field(False, "Use the _step_distilled transformer", no_effect=_NOT_IMPLEMENTED,
        group="reference flags without effect")
    sparse_attn: bool = config_field(False, "Use the _distilled_sparse transformer", no_effect=_NOT_IMPLEMENTED,
        group="reference flags without effect")

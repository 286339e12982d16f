"""``GenerateConfig``: the options of ``generate.py`` (reference §1.4), declared once.

Core reference flags keep their names and defaults (``--num_inference_steps 50``, ``--video_length 121``,
``--seed 930``, ``--aspect_ratio 16:9``, ``--dtype bf16``, ...); ``--guidance_scale``, ``--flow_shift`` and
``--device`` are new (the reference takes CFG and shift from its pipeline config). Flags of ``run_inference.sh`` that
select features this reimplementation does not have (super-resolution, prompt rewrite, offloading, sage attention,
feature cache, distilled variants) are accepted with a warning.

Departures: ``--resolution`` and ``--model_path`` have defaults (480p, ./ckpts) instead of being required, and
``--valid_video_csv`` has none (the reference's default CSV is not shipped, spec §10.24).
"""

from dataclasses import dataclass
from typing import List, Optional

from sage_grpo.config.schema import config_field

_NOT_IMPLEMENTED = "this feature of the reference's inference stack is not reimplemented"


@dataclass
class GenerateConfig:
    # ---------------------------------------------------------------- prompts
    prompt: Optional[str] = config_field(None, "Prompt to render; used only when --valid_video_csv yields no prompts")
    valid_video_csv: Optional[List[str]] = config_field(
        None, "CSV file(s) with a 'prompt' column and an optional 'seed' column; take priority over --prompt",
        nargs="+")
    negative_prompt: str = config_field("", "Negative prompt of classifier-free guidance")
    seed: int = config_field(930, "Seed of --prompt, and of CSV rows without a seed")
    # ---------------------------------------------------------------- model
    model_path: str = config_field("./ckpts", "Checkpoint root (see ckpts/README.md)")
    resolution: str = config_field("480p", "Selects the transformer version <resolution>_t2v and the video size",
                                   choices=("480p", "720p"))
    checkpoint_path: Optional[str] = config_field(
        None, "Trained weights: a checkpoint-N dir, its transformer/ subdir, a .safetensors file or a diffusers "
        "transformer folder")
    dtype: str = config_field("bf16", "Dtype the models run in", choices=("bf16", "fp32"))
    device: Optional[str] = config_field(None, "Torch device; default cuda when available, else cpu")
    # ---------------------------------------------------------------- sampling
    num_inference_steps: int = config_field(50, "Euler (ODE) denoising steps")
    video_length: int = config_field(121, "Frames per video (1 + a multiple of the VAE's temporal ratio, 4)")
    aspect_ratio: str = config_field("16:9", "Width:height of the video when --fixed_size is not given")
    fixed_size: Optional[str] = config_field(None, "HEIGHTxWIDTH override of the size, e.g. 480x864")
    guidance_scale: float = config_field(6.0, "Classifier-free guidance scale s: v = v_u + s*(v_c - v_u)")
    flow_shift: float = config_field(5.0, "Time shift of the sigma schedule, sigma = s*u / (1 + (s-1)*u)")
    # ---------------------------------------------------------------- output
    output_path: Optional[str] = config_field(
        None, "One video: this .mp4 path; several: the path without extension becomes a directory of "
        "sample_{i:03d}_seed_{seed}_{prompt}.mp4 files. Default ./outputs/output_<version>_<time>.mp4")
    save_generation_config: bool = config_field(True, "Also write <name>_config.json next to each video")
    # ---------------------------------------------------------------- accepted for compatibility
    sr: bool = config_field(True, "Super-resolution pipeline", no_effect=_NOT_IMPLEMENTED)
    save_pre_sr_video: bool = config_field(False, "Also save the pre-SR video", no_effect=_NOT_IMPLEMENTED)
    rewrite: bool = config_field(False, "Prompt rewrite through a vLLM server", no_effect=_NOT_IMPLEMENTED)
    cfg_distilled: bool = config_field(False, "Use the _distilled transformer", no_effect=_NOT_IMPLEMENTED)
    enable_step_distill: bool = config_field(False, "Use the _step_distilled transformer", no_effect=_NOT_IMPLEMENTED)
    sparse_attn: bool = config_field(False, "Use the _distilled_sparse transformer", no_effect=_NOT_IMPLEMENTED)
    offloading: bool = config_field(True, "CPU offloading", no_effect=_NOT_IMPLEMENTED)
    overlap_group_offloading: bool = config_field(True, "Overlapped group offloading", no_effect=_NOT_IMPLEMENTED)
    use_sageattn: bool = config_field(False, "SageAttention kernels", no_effect=_NOT_IMPLEMENTED)
    enable_cache: bool = config_field(False, "Feature cache (deepcache/teacache)", no_effect=_NOT_IMPLEMENTED)

"""Sampling videos from the base model or trained weights: what ``generate.py`` runs (reference §5).

1. ``plan_generation`` reads and checks everything that needs no model (prompts from CSV or ``--prompt``, seeds,
   size, output paths) and raises ``ValueError`` / ``FileNotFoundError`` before any weights load.
2. ``run_generation`` loads ``<model_path>`` with transformer version ``<resolution>_t2v``, optionally copies trained
   weights in (``--checkpoint_path``), and renders each item with the Euler ODE sampler: our rollout with every step
   deterministic (log-probs are computed but unused), CFG ``--guidance_scale`` and shift ``--flow_shift``.
3. Each video is written with imageio (libx264, 24 fps) plus ``<name>_config.json`` of the settings.

Output naming (reference §5.8): one item -> ``--output_path``; several -> the path without its extension becomes a
directory holding ``sample_{i:03d}_seed_{seed}_{sanitized prompt}.mp4``; default
``./outputs/output_{version}_{YYYY-mm-dd_HH-MM-SS}.mp4``.

Departures: the initial noise comes from a CPU generator seeded with the item's seed (the reference draws it with a
CUDA generator), so videos for a seed do not match the reference's bit for bit; no super-resolution stage.
"""

import csv
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.models import layout
from sage_grpo.pipeline.resolution import parse_size, resolution_hw
from sage_grpo.video_io import sanitize_name, write_video

VIDEO_FPS = 24
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class GenerationItem:
    prompt: str
    seed: int


@dataclass(frozen=True)
class GenerationPlan:
    items: List[GenerationItem]
    output_paths: List[Path]
    height: int
    width: int
    transformer_version: str


def read_prompt_csv(path: Path, default_seed: int) -> List[GenerationItem]:
    """Rows of a CSV with a ``prompt`` column and an optional ``seed`` column (blank cells -> ``default_seed``)."""
    if not path.is_file():
        raise FileNotFoundError(f"--valid_video_csv: {str(path)!r} does not exist")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = [c.strip() for c in reader.fieldnames or []]
        if "prompt" not in columns:
            raise ValueError(f"--valid_video_csv {path}: no 'prompt' column (columns: {columns})")
        items = []
        for line, row in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
            if not row["prompt"]:
                continue
            seed_text = row.get("seed", "")
            try:
                seed = int(float(seed_text)) if seed_text else default_seed
            except ValueError:
                message = f"--valid_video_csv {path}, line {line}: seed {seed_text!r} is not an integer"
                raise ValueError(message) from None
            items.append(GenerationItem(row["prompt"], seed))
    return items


def read_items(config: GenerateConfig) -> List[GenerationItem]:
    """CSV prompts (all files, in order); if there are none, ``--prompt`` with ``--seed``."""
    items: List[GenerationItem] = []
    for csv_path in config.valid_video_csv or []:
        found = read_prompt_csv(Path(csv_path), config.seed)
        if not found:
            raise ValueError(f"--valid_video_csv {csv_path}: the file has no prompts")
        items += found
    if not items and config.prompt and config.prompt.strip():
        items = [GenerationItem(config.prompt.strip(), config.seed)]
    if not items:
        raise ValueError("no prompt to render: pass --prompt TEXT or --valid_video_csv FILE.csv")
    return items


def output_paths(config: GenerateConfig, items: List[GenerationItem], version: str) -> List[Path]:
    target = Path(config.output_path) if config.output_path else \
        Path("outputs") / f"output_{version}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.mp4"
    if len(items) == 1:
        return [target]
    folder = target.with_suffix("")
    return [folder / f"sample_{i:03d}_seed_{item.seed}_{sanitize_name(item.prompt)}.mp4"
            for i, item in enumerate(items)]


def _vae_ratios(model_path: str) -> Optional[Tuple[int, int]]:
    """(temporal, spatial) compression of the checkpoint's VAE, read from its config (None if absent)."""
    config_file = Path(model_path) / layout.VAE.subdir / "config.json"
    if not config_file.is_file():
        return None
    vae_config = json.loads(config_file.read_text())
    return vae_config.get("temporal_compression_ratio", 4), vae_config.get("spatial_compression_ratio", 16)


def plan_generation(config: GenerateConfig) -> GenerationPlan:
    """Validate the config and resolve prompts, size and paths, without loading any model."""
    if config.resolution not in ("480p", "720p"):
        raise ValueError(f"--resolution must be 480p or 720p, got {config.resolution!r}")
    if config.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {config.dtype!r}")
    if config.num_inference_steps < 1:
        raise ValueError(f"--num_inference_steps must be >= 1, got {config.num_inference_steps}")
    ratios = _vae_ratios(config.model_path)
    temporal, spatial = ratios if ratios is not None else (4, 16)
    height, width = parse_size(config.fixed_size) if config.fixed_size else \
        resolution_hw(config.resolution, config.aspect_ratio, spatial)
    if height % spatial or width % spatial:
        raise ValueError(f"video size {height}x{width} must be a multiple of the VAE's spatial ratio {spatial}")
    if config.video_length < 1 or (config.video_length - 1) % temporal:
        raise ValueError(f"--video_length must be 1 + a multiple of {temporal} (e.g. 121), got {config.video_length}")
    items = read_items(config)
    version = f"{config.resolution}_t2v"
    return GenerationPlan(items, output_paths(config, items, version), height, width, version)


def _write_settings(video_path: Path, config: GenerateConfig, plan: GenerationPlan, item: GenerationItem) -> None:
    settings = {
        **asdict(config), "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "task": "t2v",
        "transformer_version": plan.transformer_version, "output_path": str(video_path),
        "height": plan.height, "width": plan.width, "prompt": item.prompt, "seed": item.seed,  # this video's own
    }
    video_path.with_name(f"{video_path.stem}_config.json").write_text(json.dumps(settings, indent=2))


def run_generation(config: GenerateConfig) -> List[Path]:
    """Render every planned item; returns the written video paths."""
    from sage_grpo.models.loading import load_components, load_transformer_weights
    from sage_grpo.models.text_encoding import PromptEncoder
    from sage_grpo.pipeline.rollout import rollout

    plan = plan_generation(config)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    components = load_components(config.model_path, plan.transformer_version, dtype=DTYPES[config.dtype],
                                 device=device)
    if config.checkpoint_path:
        load_transformer_weights(components.transformer, config.checkpoint_path)
    encoder = PromptEncoder.from_components(components)
    for index, (item, path) in enumerate(zip(plan.items, plan.output_paths)):
        print(f"[{index + 1}/{len(plan.items)}] seed {item.seed}: {item.prompt}")
        result = rollout(
            components.transformer, components.vae, encoder.encode([item.prompt], config.negative_prompt), [item.seed],
            num_steps=config.num_inference_steps, shift=config.flow_shift, guidance_scale=config.guidance_scale,
            num_frames=config.video_length, height=plan.height, width=plan.width, deterministic=True, progress=True,
        )
        write_video(path, result.videos[0], VIDEO_FPS)
        if config.save_generation_config:
            _write_settings(path, config, plan, item)
        print(f"saved {path}")
    return plan.output_paths

"""Everything an evaluation needs that loads no model, checked up front: a bad checkpoint path, metric, prompt CSV,
scorer folder or sampling setting is refused in one line before the first weight is read.

The sampling settings become one ``GenerateConfig`` (``generate.py``'s own, planned by its ``plan_generation``), and
each checkpoint is that config with its ``checkpoint_path``: the evaluation samples exactly as ``generate.py`` does.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import shorten
from sage_grpo.config.sections import fields_by_name, flat_items
from sage_grpo.config.validation import check_bounds, check_finite_options, check_seeds
from sage_grpo.data import read_prompt_csvs
from sage_grpo.evaluate.config import EvaluateConfig
from sage_grpo.models import layout
from sage_grpo.pipeline.generation import GenerationPlan, plan_generation
from sage_grpo.rewards.clip_score import ClipScore
from sage_grpo.rewards.scorers import VIDEOALIGN_NAMES, MetricPlan
from sage_grpo.rewards.scorers import plan_metrics as plan_scorers
from sage_grpo.safe_io import read_json_object

BASE = "base"
MAX_SETTINGS_BYTES = 1 << 20  # the cache's settings.json: a few kilobytes


@dataclass(frozen=True)
class Checkpoint:
    label: str  # as given on the command line
    weights: Optional[str]  # None: the base model
    digest: Optional[str] = None  # the content of the weights (export.identity.weights_digest); None: the base

    @property
    def key(self) -> str:
        """Folder name of its cache: readable, and unique per label."""
        from sage_grpo.video_io import sanitize_name

        digest = hashlib.sha1(self.label.encode()).hexdigest()[:8]
        return f"{sanitize_name(self.label.replace('/', '_'), 40) or 'checkpoint'}-{digest}"


@dataclass(frozen=True)
class EvaluationPlan:
    checkpoints: List[Checkpoint]
    prompts: List[str]
    seeds: List[int]
    metrics: MetricPlan
    generation: GenerateConfig  # the base model's; a checkpoint's adds checkpoint_path
    sampling: GenerationPlan
    output: Path
    model_files: Dict[str, Dict[str, str]] = field(default_factory=dict)  # folder -> component -> sampled digest

    def generate_config(self, checkpoint: Checkpoint) -> GenerateConfig:
        return replace(self.generation, checkpoint_path=checkpoint.weights)

    def sampling_for(self, checkpoint: Checkpoint) -> GenerationPlan:
        """The one sampling plan with this checkpoint's weights (the generator loads the plan's config): every
        checkpoint is sampled with the same settings, named once in the output, not with what its run recorded."""
        return replace(self.sampling, config=self.generate_config(checkpoint))

    def settings(self) -> Dict:
        """The deterministic sampler settings and scorers, written once in the output (and what the cache keys on)."""
        g, s = self.generation, self.sampling
        return {
            "sampler": "Euler ODE (deterministic), generate.py's", "num_inference_steps": g.num_inference_steps,
            "transformer_version": s.transformer_version, "height": s.height, "width": s.width,
            "video_length": g.video_length, "guidance_scale": s.guidance_scale, "flow_shift": s.flow_shift,
            "negative_prompt": g.negative_prompt, "dtype": g.dtype, "text_max_length": g.text_max_length,
            "byt5_max_length": g.byt5_max_length, "vision_num_semantic_tokens": g.vision_num_semantic_tokens,
            "model_path": g.model_path, "metrics": list(self.metrics.names),
            "videoalign_weights": self.metrics.videoalign_weights,
            "clip_model": str(self.metrics.clip_model) if self.metrics.clip_model else None,
            # what a CLIP model scores: a cache scored with fewer CLIP columns is not mixed in
            "clip_metrics": list(ClipScore.metric_names) if self.metrics.clip_model else None,
            "pickscore_model": [str(p) for p in self.metrics.pickscore_model] if self.metrics.pickscore_model else None,
            "model_files": self.model_files,
        }

    def fingerprint(self) -> str:
        return hashlib.sha1(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:16]


def parse_checkpoints(values: Optional[List[str]]) -> List[Checkpoint]:
    if not values:
        raise ValueError("--checkpoints is required: e.g. --checkpoints base outputs/run/checkpoint-100")
    if len(set(values)) != len(values):
        raise ValueError(f"--checkpoints names one twice: {values}")
    checkpoints = []
    for value in values:
        if value == BASE:
            checkpoints.append(Checkpoint(BASE, None))
        elif not Path(value).exists():
            raise FileNotFoundError(f"--checkpoints {value}: no such file or directory (or use 'base')")
        else:
            checkpoints.append(Checkpoint(value, value))
    return checkpoints


def plan_metrics(config: EvaluateConfig) -> MetricPlan:
    """``--metrics`` checked and its scorers' folders found (:func:`sage_grpo.rewards.scorers.plan_metrics`, the
    trainer's ``--validation_metrics`` too)."""
    return plan_scorers([config.metrics], model_root=config.model_path, clip_model=config.clip_model,
                        pickscore_model=config.pickscore_model, pickscore_processor=config.pickscore_processor,
                        reward_weights=config.reward_weights)


# Options evaluate shares with generate.py by name pass unchanged, but these two: an unset guidance is the version's
# own (generate.py's default is not None), and the device falls back to this rank's.
_NOT_SHARED = ("guidance_scale", "device")


def generation_config(config: EvaluateConfig, prompt: str, seed: int, device: Optional[str]) -> GenerateConfig:
    """``generate.py``'s config for these sampling settings (one video per call, nothing written by it)."""
    shared = {name: value for name, value in flat_items(config)
              if name in fields_by_name(GenerateConfig) and name not in _NOT_SHARED}
    guidance = {} if config.guidance_scale is None else {"guidance_scale": config.guidance_scale}
    return GenerateConfig(prompt=prompt, seed=seed, device=config.device or device, save_generation_config=False,
                          **shared, **guidance)


def plan_evaluation(config: EvaluateConfig, device: Optional[str] = None) -> EvaluationPlan:
    """Validate everything; raises ValueError / FileNotFoundError with a one-line message. Loads no model."""
    check_finite_options(config)
    check_seeds(config)  # every seed, not only the first one the generation plan below is made with
    check_bounds(config)  # every number in its range, before any file is read
    checkpoints = parse_checkpoints(config.checkpoints)
    if not config.prompts:
        raise ValueError("--prompts is required: a CSV with a 'prompt' column")
    prompts, repeated = unique_prompts([item.prompt for item in read_prompt_csvs([config.prompts], notes=[])])
    if not config.seeds or len(set(config.seeds)) != len(config.seeds):
        raise ValueError(f"--seeds must name distinct seeds, got {config.seeds}")
    metrics = plan_metrics(config)
    generation = generation_config(config, prompts[0], config.seeds[0], device)
    sampling = plan_generation(generation)
    transformer_dir = Path(config.model_path) / layout.transformer_layout(sampling.transformer_version).subdir
    if not transformer_dir.is_dir():
        raise FileNotFoundError(f"--model_path {config.model_path}: no transformer {sampling.transformer_version} "
                                f"at {transformer_dir} (bash download_weights.sh, or the tiny checkpoint)")
    check_output(config, checkpoints, metrics)
    checkpoints = identify_checkpoints(checkpoints, config.model_path, sampling.transformer_version)
    plan = EvaluationPlan(checkpoints, prompts, list(config.seeds), metrics, generation, sampling,
                          Path(config.output), model_files(config.model_path, sampling.transformer_version, metrics))
    check_cache_settings(plan)
    if repeated:
        plan.sampling.notes.append(f"--prompts {config.prompts}: {repeated}")
    from sage_grpo.resume import SAMPLED_IDENTITY

    plan.sampling.notes.append(SAMPLED_IDENTITY.format(what="the base model (--model_path) and each scorer",
                                                       compared="identified in the cache"))
    return plan


def unique_prompts(prompts: List[str]) -> Tuple[List[str], Optional[str]]:
    """The prompts in order with each repeat left out, and a line naming the repeated ones (None: no repeat).

    Every prompt is sampled with the same ``--seeds``, so a repeated row would only sample the same videos again and
    count them as further samples in the means and their standard errors: each prompt is evaluated once."""
    counts = Counter(prompts)
    repeated = [prompt for prompt in counts if counts[prompt] > 1]
    if not repeated:
        return prompts, None
    shown = "; ".join(f"{shorten(prompt, 60)} ({counts[prompt]} rows)" for prompt in repeated[:5])
    more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
    return list(counts), (f"{len(repeated)} prompt(s) repeated, each evaluated once ({len(counts)} distinct prompts "
                          f"of {len(prompts)} rows): {shown}{more}")


def check_output(config: EvaluateConfig, checkpoints: List[Checkpoint], metrics: MetricPlan) -> None:
    """``--output`` is a folder (or new) outside everything the evaluation reads."""
    from sage_grpo.safe_io import check_output_outside_inputs

    output = Path(config.output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; pass a folder (new, or one this evaluation wrote)")
    inputs = {f"--checkpoints {c.label}": c.weights for c in checkpoints}
    inputs.update({"--model_path": config.model_path, "--prompts": config.prompts,
                   "--clip_model": metrics.clip_model,
                   **({"--pickscore_model": metrics.pickscore_model[0], "--pickscore_processor":
                       metrics.pickscore_model[1]} if metrics.pickscore_model else {})})
    check_output_outside_inputs(output, "--output", inputs)


def identify_checkpoints(checkpoints: List[Checkpoint], model_path: str, version: str) -> List[Checkpoint]:
    """Every trained checkpoint checked as loadable into the base transformer (names, shapes, plain data: one line
    naming the file otherwise) and identified by the content of its weights, before any video is sampled."""
    from sage_grpo.export.identity import check_loadable, transformer_shapes, weights_digest

    if all(c.weights is None for c in checkpoints):
        return checkpoints
    expected = transformer_shapes(model_path, version)
    for checkpoint in checkpoints:
        if checkpoint.weights is not None:
            check_loadable(checkpoint.weights, expected, "--checkpoints")
    return [replace(c, digest=weights_digest(c.weights)) if c.weights is not None else c for c in checkpoints]


def model_files(model_path: str, version: str, metrics: MetricPlan) -> Dict[str, Dict[str, str]]:
    """What the base model and the scorers are identified by in the cache's settings: per folder, the sampled digest
    of :func:`sage_grpo.resume.model_fingerprint` (configs whole; weight files by size and 64 KiB sampled from each,
    so weights replaced in place by others of the same size that differ only outside the samples are not seen)."""
    from sage_grpo.resume import folder_digest, model_fingerprint

    folders = {"--model_path": model_fingerprint(Path(model_path), version)}
    scorers = [("videoalign", Path(model_path) / "VideoReward")] if set(metrics.names) & set(VIDEOALIGN_NAMES) else []
    scorers += [("clipscore", metrics.clip_model)] if metrics.clip_model else []
    scorers += [("pickscore", p) for p in metrics.pickscore_model or ()]
    folders["scorers"] = {f"{name} {path}": folder_digest(Path(path)) for name, path in scorers}
    return folders


def check_cache_settings(plan: EvaluationPlan) -> None:
    """A cache made with other settings is never mixed in nor deleted: the user picks a new --output. A settings file
    that is not this project's is named in one line."""
    settings_file = plan.output / "cache" / "settings.json"
    if not settings_file.is_file():
        return
    cached = read_json_object(settings_file, "the evaluation cache's settings",
                              f"use a new --output, or delete {settings_file.parent} to start over", error=ValueError,
                              max_bytes=MAX_SETTINGS_BYTES)
    now = json.loads(json.dumps(plan.settings()))
    changed = sorted(key for key in set(cached) | set(now) if cached.get(key) != now.get(key))
    if changed:
        raise ValueError(f"--output {plan.output} holds results sampled or scored with other settings (differ: "
                         f"{shorten(', '.join(changed), quote=False)}); use a new --output, or delete "
                         f"{settings_file.parent} to start over")


def write_cache_settings(plan: EvaluationPlan) -> None:
    from sage_grpo.safe_io import atomic_write

    folder = plan.output / "cache"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "settings.json", json.dumps(plan.settings(), indent=2, sort_keys=True))

"""Sampling videos from the base model or trained weights: what ``generate.py`` runs
(docs/reference.md#the-sampling-script).

1. ``plan_generation`` reads and checks everything that needs no model (prompts from CSV or ``--prompt``, seeds,
   size, output paths, weight paths, the inference-speed flags against the device) and raises ``ValueError`` /
   ``FileNotFoundError`` before any weights load.
2. ``VideoGenerator`` loads ``<model_path>`` with transformer version ``<resolution>_t2v`` (``_distilled`` with
   ``--cfg_distilled``; any folder with ``--model_version``), puts trained weights in
   (``--checkpoint_path``: full, LoRA or sharded-DCP training checkpoints and exported folders; ``--lora_path``: an
   adapter folder; LoRA adapters are merged into the weights, see :mod:`sage_grpo.export.weights`), applies the speed
   settings and renders each item with the Euler ODE sampler: our rollout with every step deterministic, CFG
   ``--guidance_scale`` and shift ``--flow_shift`` (unset: the version's guider and scheduler configs,
   :mod:`sage_grpo.models.variants`, else CFG 6.0 and the reference's shift for the version, 480p_t2v 5.0 and
   720p_t2v 9.0). It equals diffusers' ``HunyuanVideo15Pipeline`` given the same transformer and initial latents
   (tested to 1e-5 in fp32), except at guidance scales below 1, where diffusers still mixes in the unconditional
   branch and we, as the reference, use the conditional velocity alone.
   With a reference image (``--image_path``, or a CSV ``ref_image_path`` column, relative to the CSV) the task is
   image-to-video: the ``<resolution>_i2v`` transformer, the image condition of diffusers'
   ``HunyuanVideo15ImageToVideoPipeline`` (:mod:`sage_grpo.models.image_condition`; equal to that pipeline given the
   same initial latents, tested to 1e-5 in fp32) and, unless ``--fixed_size`` is given, the size of the crop-size
   bucket of the resolution (480p: 640, 720p: 960) closest to the image's aspect ratio (``--aspect_ratio`` is not
   used). One run renders one task: with an image for one prompt, every prompt needs one.
3. Each video is written with imageio (libx264, 24 fps) plus ``<name>_config.json`` of the settings.

Inference-speed flags (``--offloading``, ``--group_offloading``, ``--enable_torch_compile``, ``--use_sageattn``,
``--enable_cache``): :mod:`sage_grpo.pipeline.acceleration`.

Output naming (docs/reference.md#the-sampling-script, sage_grpo/pipeline/output_paths.py): a ``.mp4`` path takes one
item; several go to that path without its extension, a folder of ``sample_{i:03d}_seed_{seed}_{sanitized prompt}.mp4``;
an existing folder or a path without extension is such a folder for any number of items; default
``./outputs/output_{version}_{YYYY-mm-dd_HH-MM-SS}.mp4``.

Departures: the initial noise comes from a CPU generator seeded with the item's seed (the reference draws it with a
CUDA generator), so videos for a seed do not match the reference's bit for bit; no super-resolution stage; the
reference loads ``--checkpoint_path`` after its speed optimisations, we load weights first (so merged LoRA weights
are what gets compiled and offloaded).
"""

import contextlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from sage_grpo.config.generate import DEFAULT_GUIDANCE_SCALE, GenerateConfig
from sage_grpo.config.schema import is_explicit, shorten
from sage_grpo.config.validation import check_bounds, check_finite_options, check_seeds, parse_size
from sage_grpo.data import check_image, read_prompt_csvs
from sage_grpo.dtypes import DTYPES
from sage_grpo.models import layout
from sage_grpo.models.attention import check_attention_backend
from sage_grpo.models.config_fields import read_model_config
from sage_grpo.models.variants import resolve_generation_sampling
from sage_grpo.pipeline.acceleration import Acceleration, apply_acceleration, plan_acceleration
from sage_grpo.pipeline.output_paths import output_paths, replaced_files
from sage_grpo.pipeline.recorded import apply_recorded_settings, transformer_version
from sage_grpo.models.resolution import RESOLUTION_BUCKET_BASE, resolution_hw
from sage_grpo.video_io import write_video

VIDEO_FPS = 24


@dataclass(frozen=True)
class GenerationItem:
    prompt: str
    seed: int
    image_path: str = ""  # the reference image (image-to-video), "" for text-to-video
    size: Optional[Tuple[int, int]] = None  # (H, W) of an image-to-video item; None: the plan's size


@dataclass(frozen=True)
class GenerationPlan:
    items: List[GenerationItem]
    output_paths: List[Path]
    height: int
    width: int
    transformer_version: str
    guidance_scale: float  # --guidance_scale, or the checkpoint's --cfg_scale, or the version's guider config
    flow_shift: float  # --flow_shift, or the version's scheduler config, or the reference's shift for the version
    device: torch.device = torch.device("cpu")
    acceleration: Acceleration = Acceleration()
    notes: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)  # explicit settings that contradict the version's configs
    config: Optional[GenerateConfig] = None  # the options with the checkpoint's recorded settings filled in


def image_path_flag(config: GenerateConfig) -> str:
    """``--image_path`` checked (it must decode), "" when unset or 'none' (the reference's spelling of no image)."""
    text = (config.image_path or "").strip()
    if not text or text.lower() == "none":
        return ""
    return check_image(text, Path.cwd(), "--image_path")


def read_items(config: GenerateConfig, notes: List[str]) -> List[GenerationItem]:
    """The prompts of every ``--valid_video_csv`` file in order (the trainer's reader, :func:`read_prompt_csvs`; a row
    without a seed gets ``--seed``, one without a ``ref_image_path`` gets ``--image_path``; skipped empty rows go to
    ``notes``); without CSVs, ``--prompt`` with ``--seed`` and ``--image_path``. One task per run."""
    image = image_path_flag(config)
    if config.valid_video_csv:
        items = [GenerationItem(item.prompt, item.seed, item.ref_image_path or image)
                 for item in read_prompt_csvs(config.valid_video_csv, default_seed=config.seed, notes=notes)]
    elif config.prompt and config.prompt.strip():
        items = [GenerationItem(config.prompt.strip(), config.seed, image)]
    else:
        raise ValueError("no prompt to render: pass --prompt TEXT or --valid_video_csv FILE.csv")
    without = [item.prompt for item in items if not item.image_path]
    if len(without) not in (0, len(items)):
        raise ValueError(f"{len(items) - len(without)} prompt(s) have a reference image and {len(without)} do not "
                         f"(first: {without[0][:40]!r}); one run renders one task: give every prompt an image "
                         "(--image_path is the default for rows without one) or none")
    return items


def _vae_ratios(model_path: str) -> Optional[Tuple[int, int]]:
    """(temporal, spatial) compression of the checkpoint's VAE, read from its config (None if absent)."""
    config_file = Path(model_path) / layout.VAE.subdir / "config.json"
    if not config_file.is_file():
        return None
    vae_config = read_model_config(config_file, "vae")
    return vae_config.get("temporal_compression_ratio", 4), vae_config.get("spatial_compression_ratio", 16)


def _check_weight_paths(config: GenerateConfig) -> None:
    """Each weights location holds weights this project reads (no tensor is read here)."""
    from sage_grpo.export.weights import locate_trained_weights  # imported here: export imports the model classes

    for option, value in (("--checkpoint_path", config.checkpoint_path), ("--lora_path", config.lora_path)):
        if value and not Path(value).exists():
            raise FileNotFoundError(f"{option} {value}: no such file or directory")
        if value:
            try:
                locate_trained_weights(value)
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{option}: {err}") from None


def plan_generation(config: GenerateConfig) -> GenerationPlan:
    """Validate the config and resolve prompts, size, paths and speed settings, without loading any model; the
    settings the ``--checkpoint_path`` run recorded fill the unset options (:mod:`sage_grpo.pipeline.recorded`)."""
    check_finite_options(config)  # --flow_shift nan rendered black frames; --guidance_scale nan turned CFG off
    check_seeds(config)
    config, recorded_notes = apply_recorded_settings(config)  # the checkpoint's file, checked like the flags
    check_bounds(config)  # every number in its range: the flags' and the recorded ones
    if config.resolution not in ("480p", "720p"):
        raise ValueError(f"--resolution must be 480p or 720p, got {config.resolution!r}")
    if config.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {config.dtype!r}")
    ratios = _vae_ratios(config.model_path)
    temporal, spatial = ratios if ratios is not None else (4, 16)
    height, width = parse_size(config.fixed_size) or resolution_hw(config.resolution, config.aspect_ratio, spatial)
    if height % spatial or width % spatial:
        raise ValueError(f"video size {height}x{width} must be a multiple of the VAE's spatial ratio {spatial}")
    if config.video_length < 1 or (config.video_length - 1) % temporal:
        raise ValueError(f"--video_length must be 1 + a multiple of {temporal} (e.g. 121), got {config.video_length}")
    _check_weight_paths(config)
    csv_notes: List[str] = []
    items = read_items(config, csv_notes)
    if items[0].image_path:  # image-to-video: each item at its image's bucket unless --fixed_size
        from sage_grpo.models.image_condition import closest_bucket, image_size

        fixed = parse_size(config.fixed_size)
        items = [replace(item, size=fixed or closest_bucket(image_size(item.image_path),
                                                             RESOLUTION_BUCKET_BASE[config.resolution], spatial))
                 for item in items]
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        check_attention_backend(config.attention_backend, device)
    except ValueError as err:
        raise ValueError(f"--attention_backend: {err}") from None
    acceleration, notes = plan_acceleration(config, device)
    version = transformer_version(config, "i2v" if items[0].image_path else "t2v")
    guidance = DEFAULT_GUIDANCE_SCALE if config.guidance_scale is None else config.guidance_scale
    guidance, shift, variant_warnings, variant_notes = resolve_generation_sampling(
        config.model_path, version, guidance, is_explicit(config, "guidance_scale"), config.flow_shift)
    paths = output_paths(config.output_path, items, version)
    replaced = replaced_files(paths + ([settings_path(p) for p in paths] if config.save_generation_config else []))
    notes += [f"--output_path: {len(replaced)} existing file(s) replaced: {shorten(', '.join(map(str, replaced)))}"
              ] if replaced else []
    return GenerationPlan(items, paths, height, width, version, guidance, shift, device, acceleration,
                          recorded_notes + csv_notes + notes + variant_notes, variant_warnings, config)


def _write_settings(video_path: Path, config: GenerateConfig, plan: GenerationPlan, item: GenerationItem) -> None:
    settings = {
        **asdict(config), "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "task": "i2v" if item.image_path else "t2v", "image_path": item.image_path or None,
        "transformer_version": plan.transformer_version, "output_path": str(video_path),
        "height": (item.size or (plan.height, plan.width))[0], "width": (item.size or (plan.height, plan.width))[1],
        "flow_shift": plan.flow_shift,
        "guidance_scale": plan.guidance_scale,
        "prompt": item.prompt, "seed": item.seed,  # this video's own
    }
    settings_path(video_path).write_text(json.dumps(settings, indent=2))


def settings_path(video_path: Path) -> Path:
    """Where ``--save_generation_config`` writes a video's settings."""
    return video_path.with_name(f"{video_path.stem}_config.json")


class VideoGenerator:
    """The loaded models of ``generate.py`` and the sampling of one video (:meth:`render`)."""

    def __init__(self, config: GenerateConfig, plan: GenerationPlan):
        """``config``: generate.py's options; the plan's copy (with the checkpoint's recorded settings) is used."""
        from sage_grpo.export.weights import apply_trained_weights, read_trained_weights
        from sage_grpo.models.attention import install_joint_attention
        from sage_grpo.models.loading import load_components
        from sage_grpo.models.text_encoding import PromptEncoder, TextEncoderSettings

        config = plan.config or config
        self.config, self.plan, self.device = config, plan, plan.device
        accel = plan.acceleration
        on_cpu = accel.model_offload or accel.group_offload
        self.components = load_components(config.model_path, plan.transformer_version, dtype=DTYPES[config.dtype],
                                          device="cpu" if on_cpu else self.device)
        self.transformer = self.components.transformer
        for path in (config.checkpoint_path, config.lora_path):
            if path:
                apply_trained_weights(self.transformer, read_trained_weights(path))
        install_joint_attention(self.transformer, config.attention_backend)
        apply_acceleration(self.transformer, accel, self.device)
        if on_cpu and not accel.model_offload:  # group offloading alone: everything but the blocks lives on the GPU
            for module in (self.components.text_encoder, self.components.text_encoder_2, self.components.vae):
                module.to(self.device)
        settings = TextEncoderSettings(max_length=config.text_max_length or TextEncoderSettings.max_length,
                                       max_length_2=config.byt5_max_length)
        self.encoder = PromptEncoder.from_components(self.components, settings)
        self.images = None
        if self.components.image_encoder is not None:
            from sage_grpo.models.image_condition import ImageConditionEncoder

            if on_cpu and not accel.model_offload:
                self.components.image_encoder.to(self.device)
            # a CSV's rows come back only for their extra seeds: 1 GiB (~580 conditions at 352x624) is plenty
            self.images = ImageConditionEncoder(self.components.image_encoder, self.components.feature_extractor,
                                                self.components.vae, max_cache_bytes=2 ** 30)

    @contextlib.contextmanager
    def _stage(self, modules: Sequence[torch.nn.Module]) -> Iterator[None]:
        """With ``--offloading``: ``modules`` on the device for the block, back on the CPU after."""
        offload = self.plan.acceleration.model_offload
        for module in modules if offload else ():
            module.to(self.device)
        try:
            yield
        finally:
            for module in modules if offload else ():
                module.to("cpu")

    @torch.no_grad()
    def render(self, item: GenerationItem, progress: bool = False) -> torch.Tensor:
        """(3, F, H, W) float video in [0, 1] on the CPU."""
        from sage_grpo.models.vae import decode_latents
        from sage_grpo.pipeline.rollout import VideoSize, rollout
        from sage_grpo.pipeline.sampler import Sampler

        config, plan, c = self.config, self.plan, self.components
        height, width = item.size or (plan.height, plan.width)
        with self._stage([c.text_encoder, c.text_encoder_2]):
            embeds = self.encoder.encode([item.prompt], config.negative_prompt)
        if item.image_path:
            with self._stage([c.image_encoder, c.vae]):
                embeds = embeds.with_image(self.images.encode([item.image_path], height, width))
        # group-offloaded blocks move themselves; the rest of that transformer already sits on the device
        transformer_stage = [] if plan.acceleration.group_offload else [self.transformer]
        cache = self.transformer.cache_context("generate") if plan.acceleration.cache else contextlib.nullcontext()
        with self._stage(transformer_stage), cache:
            sampler = Sampler.euler(config.num_inference_steps, plan.flow_shift, plan.guidance_scale,
                                    num_image_tokens=config.vision_num_semantic_tokens)
            result = rollout(sampler, self.transformer, c.vae, embeds, [item.seed],
                             VideoSize(config.video_length, height, width), deterministic=True, decode=False,
                             progress=progress)
        if plan.acceleration.cache:
            self.transformer._reset_stateful_cache()  # the next video starts a fresh cache, as diffusers' pipelines do
        with self._stage([c.vae]):
            return decode_latents(c.vae, result.final_latents.to(c.vae.device))[0]


class NonFiniteVideoError(ValueError):
    """A sampled video holds NaN or inf pixels (weights holding NaN or inf): nothing is written for it."""


def weights_named(config: GenerateConfig) -> str:
    """The weights a generation samples with, as flags."""
    return ", ".join(f"{flag} {path}" for flag, path in (("--model_path", config.model_path),
                                                          ("--checkpoint_path", config.checkpoint_path),
                                                          ("--lora_path", config.lora_path)) if path)


def run_generation(config: GenerateConfig) -> List[Path]:
    """Render every planned item; returns the written video paths."""
    plan = plan_generation(config)
    for note in plan.notes:
        print(f"note: {note}")
    for message in plan.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    generator = VideoGenerator(config, plan)
    for index, (item, path) in enumerate(zip(plan.items, plan.output_paths)):
        print(f"[{index + 1}/{len(plan.items)}] seed {item.seed}: {item.prompt}")
        video = generator.render(item, progress=True)
        if not torch.isfinite(video).all():  # a NaN video is written as black frames: refused instead
            raise NonFiniteVideoError(
                f"the video of prompt {shorten(item.prompt)} (seed {item.seed}) is not finite (NaN or inf pixels), "
                f"so it is not written to {path}: the weights hold NaN or inf ({weights_named(config)}), or the "
                "settings overflow the model's range")
        write_video(path, video, VIDEO_FPS)
        if config.save_generation_config:
            _write_settings(path, plan.config, plan, item)
        print(f"saved {path}")
    return plan.output_paths

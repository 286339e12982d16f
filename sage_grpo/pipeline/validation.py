"""Scored validation: the held-out prompts sampled, written and measured at every ``--validation_interval``.

One :class:`Validator`, built once by the trainer, runs a validation step::

    result = validator.run(step)        # every rank calls it (the policy's FSDP / SP collectives need them all)
    result.samples                      # ValidationSamples: prompts, embeddings, latents, decoded videos
    result.metrics                      # {"Validation/<key>": float}: the same dict on every rank

Sampling is as before: each validation prompt (``--valid_video_csv``, else ``--validation_prompts``) with its own seed,
the deterministic (Euler ODE) sampler of ``--validation_num_inference_steps`` steps, so that the same weights give the
same videos at every validation. The main process decodes the videos, writes them to ``samples/step_{step:06d}/`` and
hands them to the trackers. Then every **validation metric** measures the samples:

* the training reward and each of its sub-rewards (:class:`VideoScoreMetric` of the trainer's reward:
  ``Validation/avg``, ``Validation/<reward key>``, and how much the videos differ in each,
  ``ValidationSpread/<key>``);
* the held-out scorers ``--validation_metrics`` names (CLIPScore, PickScore, VideoAlign, any registered reward:
  :class:`sage_grpo.rewards.scorers.Scorers`, the evaluation command's own);
* whatever is added with :meth:`Validator.add_metric`.

Each metric's value is the mean over the validation prompts (NaN where a reward failed are left out). The time it
costs is logged beside: ``Validation/sampling_time`` (sampling, decoding, writing), ``Validation/<metric name>_time``
per metric and ``Validation/time`` in all.

Adding a metric computed from the validation samples and the models (a drift proxy, say) takes an object with a
``name``, two flags and a call::

    class MyMetric:
        name = "my_metric"               # its time is logged as Validation/my_metric_time
        main_only = False                # False: called on every rank (it may run the models, whose collectives
                                         # need every rank); True: on the main process only, which alone holds
                                         # the decoded videos
        needs_trajectories = True        # keep each sample's whole x_0..x_N (else only the final latent x_N)

        def __call__(self, samples: ValidationSamples) -> Dict[str, float]:
            ...                          # samples.models (policy, reference, vae), samples.sampler (its sigmas),
            return {"my_key": value}     # samples.samples[i].latents / .embeds / .video / .item

    trainer.validator.add_metric(MyMetric())   # logged as Validation/my_key

Keys are prefixed with ``Validation/`` unless they hold a ``/`` already. The main process's values are logged and
broadcast, so every rank's ``result.metrics`` is the same (a rule acting on them acts on every rank alike).
"""

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Tuple

import torch
from torch import Tensor

from sage_grpo.config.train.run import ValidationConfig
from sage_grpo.data import PromptItem, read_prompt_csvs
from sage_grpo.distributed.collectives import broadcast_object_from_main
from sage_grpo.models.bundle import ModelBundle
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.tracking.trackers import LoggedVideo
from sage_grpo.video_io import sanitize_name, write_video

PREFIX = "Validation/"
SPREAD_PREFIX = "ValidationSpread/"  # a per-video score's standard deviation over the validation videos
DEFAULT_VALIDATION_PROMPT = "A beautiful sunset over the ocean with waves gently crashing on the shore"


def validation_items(validation: ValidationConfig) -> List[PromptItem]:
    """The validation prompts of the configuration's ``validation`` section: ``--valid_video_csv`` (a row without a
    seed: ``--validation_global_seed``, docs/reference.md#validation), else ``--validation_prompts``, else the
    reference's default prompt."""
    if validation.valid_video_csv:
        return read_prompt_csvs(validation.valid_video_csv, default_seed=validation.validation_global_seed)
    prompts = validation.validation_prompts or [DEFAULT_VALIDATION_PROMPT]
    return [PromptItem(i, p, validation.validation_global_seed) for i, p in enumerate(prompts)]


@dataclass
class ValidationSample:
    """One validation prompt's sample."""

    item: PromptItem  # prompt, seed, task (and reference image of an image-to-video row)
    embeds: PromptEmbeds  # its embeddings on the device (the image condition of an i2v item included)
    latents: Tensor  # (1, N+1, C, T, h, w) fp32 on the device: x_0..x_N, or (1, 1, ...) x_N alone (needs_trajectories)
    video: Optional[Tensor] = None  # (3, F, H, W) in [0, 1] on the CPU; on the main process only


@dataclass
class ValidationSamples:
    """What every validation metric receives."""

    step: int  # the global step validated (0: before training)
    sampler: Sampler  # the validation sampler: its sigmas (N+1,), guidance, micro-batch
    models: ModelBundle  # the trainer's: policy, reference (None without a KL reference), vae, encode, decode
    is_main: bool
    samples: List[ValidationSample] = field(default_factory=list)

    @property
    def prompts(self) -> List[str]:
        return [sample.item.prompt for sample in self.samples]


class ValidationMetric(Protocol):
    name: str
    main_only: bool
    needs_trajectories: bool

    def __call__(self, samples: ValidationSamples) -> Dict[str, float]: ...


@dataclass
class ValidationResult:
    samples: ValidationSamples
    metrics: Dict[str, float]


def mean_over_videos(scores: List[Dict[str, float]]) -> Dict[str, float]:
    """{key: mean of the finite values} over per-video score dicts (NaN when a key has none)."""
    keys = list(dict.fromkeys(key for row in scores for key in row))
    means = {}
    for key in keys:
        finite = [row[key] for row in scores if key in row and math.isfinite(row[key])]
        means[key] = sum(finite) / len(finite) if finite else math.nan
    return means


def spread_over_videos(scores: List[Dict[str, float]]) -> Dict[str, float]:
    """{``ValidationSpread/<key>``: the standard deviation (population) of the finite values} over per-video score
    dicts (NaN when a key has fewer than two): how much the validation videos differ in that score, the yardstick of
    the drift guard's per-dimension check (:mod:`sage_grpo.rl.drift_rules`)."""
    spreads = {}
    for key, mean in mean_over_videos(scores).items():
        finite = [row[key] for row in scores if key in row and math.isfinite(row[key])]
        spreads[SPREAD_PREFIX + key] = (math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
                                        if len(finite) > 1 else math.nan)
    return spreads


def per_video(reward_fn: Callable) -> Callable[[Tensor, str], Dict[str, float]]:
    """A reward callable (``fn(videos (B, 3, F, H, W), prompts) -> {key: (B,)}``, the trainer's reward) as a scorer of
    one video ``(3, F, H, W)`` and its prompt."""
    def score(video: Tensor, prompt: str) -> Dict[str, float]:
        scored = reward_fn(video[None], [prompt])
        return {key: float(torch.as_tensor(value).reshape(-1)[0]) for key, value in scored.items()}

    return score


class VideoScoreMetric:
    """A per-video scorer (``score(video (3, F, H, W), prompt) -> {key: float}``: the training reward through
    :func:`per_video`, or the held-out :class:`~sage_grpo.rewards.scorers.Scorers`) over the validation videos, one
    video per call (their sizes may differ: image-to-video buckets); the mean over the prompts, and the spread over
    them (:func:`spread_over_videos`)."""

    main_only, needs_trajectories = True, False

    def __init__(self, name: str, score: Callable[[Tensor, str], Dict[str, float]]):
        self.name, self.score = name, score

    @torch.no_grad()
    def __call__(self, samples: ValidationSamples) -> Dict[str, float]:
        scores = [self.score(sample.video, sample.item.prompt) for sample in samples.samples]
        return {**mean_over_videos(scores), **spread_over_videos(scores)}


@dataclass(frozen=True)
class ValidationSettings:
    """The run's validation settings, decided once by the trainer."""

    items: Tuple[PromptItem, ...]
    num_frames: int  # --validate_video_length
    fps: int  # --video_fps of the written videos
    size_of: Callable[[PromptItem], Tuple[int, int]]  # (H, W) of an item's videos


class Validator:
    """Samples, writes and measures the validation prompts (module docstring); built once, called per validation."""

    def __init__(self, settings: ValidationSettings, sampler: Sampler, models: ModelBundle, *, is_main: bool,
                 encode: Callable[[List[PromptItem], Tuple[int, int]], PromptEmbeds],
                 log_videos: Callable[[List[LoggedVideo], int], None]):
        self.settings, self.sampler, self.models, self.is_main = settings, sampler, models, is_main
        self.encode, self.log_videos = encode, log_videos
        self.metrics: List[ValidationMetric] = []

    def add_metric(self, metric: ValidationMetric) -> None:
        if any(existing.name == metric.name for existing in self.metrics):
            raise ValueError(f"a validation metric named {metric.name!r} is registered already")
        self.metrics.append(metric)

    @torch.no_grad()
    def run(self, step: int, out_dir: Path) -> ValidationResult:
        """Sample every validation prompt (every rank), write the videos to ``out_dir`` (main) and measure them."""
        start = time.perf_counter()
        samples = self.sample(step, out_dir)
        metrics = {"sampling_time": time.perf_counter() - start}
        for metric in self.metrics:
            if metric.main_only and not self.is_main:
                continue
            began = time.perf_counter()
            metrics.update(metric(samples))
            metrics[f"{metric.name}_time"] = time.perf_counter() - began
        metrics["time"] = time.perf_counter() - start
        metrics = {key if "/" in key else PREFIX + key: float(value) for key, value in metrics.items()}
        return ValidationResult(samples, broadcast_object_from_main(metrics if self.is_main else None))

    def sample(self, step: int, out_dir: Path) -> ValidationSamples:
        settings, policy = self.settings, self.models.policy
        keep_trajectories = any(metric.needs_trajectories for metric in self.metrics)
        samples = ValidationSamples(step, self.sampler, self.models, self.is_main)
        logged: List[LoggedVideo] = []
        if self.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
        policy.eval()
        for number, item in enumerate(settings.items):
            height, width = settings.size_of(item)
            embeds = self.encode([item], (height, width))
            result = self.sampler.rollout(policy, self.models.vae, embeds, [item.seed], num_frames=settings.num_frames,
                                          height=height, width=width, deterministic=True, decode=False)
            latents = result.latents if keep_trajectories else result.latents[:, -1:]
            sample = ValidationSample(item, embeds, latents)
            if self.is_main:  # only the main process decodes (tiled above --vae_tiling's threshold) and writes
                sample.video = self.models.decode(result.latents[:, -1])[0]
                name = f"sample_{number:03d}_seed_{item.seed}_{sanitize_name(item.prompt)}.mp4"
                write_video(out_dir / name, sample.video, settings.fps)
                logged.append(LoggedVideo(out_dir / name, f"{item.prompt} (seed {item.seed})", settings.fps))
            samples.samples.append(sample)
            del result
        policy.train()
        self.log_videos(logged, step)
        return samples

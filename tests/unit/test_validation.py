"""Scored validation (sage_grpo/pipeline/validation.py): a validation step samples every prompt, writes the videos and
measures them with every validation metric; the metrics are means over the prompts, logged as ``Validation/...`` with
their times. The sampler and the models are stand-ins whose videos are known numbers, so the means are exact."""
import math
from types import SimpleNamespace

import pytest
import torch

from sage_grpo.data import PromptItem
from sage_grpo.pipeline.validation import (ValidationSettings, Validator, VideoScoreMetric, mean_over_videos,
                                           per_video)
from sage_grpo.tracking.run_dir import MetricsLogger, read_metrics, tensorboard_tag, training_rows, validation_rows

ITEMS = (PromptItem(0, "a red disk", 3), PromptItem(1, "a blue disk", 5))
NUM_STEPS = 2  # the stand-in sampler's trajectory: x_0, x_1, x_2 = seed, seed + 1, seed + 2


class StandInSampler:
    """rollout(...) of one prompt: latents (1, N+1, 1, 1, 1, 1) = seed + k at step k."""

    def __init__(self):
        self.calls = []

    def rollout(self, policy, vae, embeds, seeds, *, num_frames, height, width, deterministic, decode):
        self.calls.append((embeds, seeds[0], num_frames, height, width, deterministic, decode))
        trajectory = seeds[0] + torch.arange(NUM_STEPS + 1, dtype=torch.float32)
        return SimpleNamespace(latents=trajectory.reshape(1, NUM_STEPS + 1, 1, 1, 1, 1))


def stand_in_models():
    """decode: x_N -> a (1, 3, 2, 8, 8) video whose every pixel is x_N / 10 (the second prompt: 0.7, the first 0.5)."""
    return SimpleNamespace(policy=torch.nn.Linear(1, 1), vae=None,
                           decode=lambda latents: torch.full((1, 3, 2, 8, 8), float(latents.flatten()[0]) / 10))


def make_validator(is_main=True, logged=None):
    settings = ValidationSettings(ITEMS, num_frames=2, fps=8, size_of=lambda item: (8, 8))
    return Validator(settings, StandInSampler(), stand_in_models(), is_main=is_main,
                     encode=lambda items, size: f"embeds of {items[0].prompt} at {size}",
                     log_videos=lambda videos, step: (logged if logged is not None else []).append((videos, step)))


def brightness(videos, prompts):  # a reward callable: (B, 3, F, H, W) -> {key: (B,)}
    return {"brightness": videos.mean(dim=(1, 2, 3, 4)), "avg": 2 * videos.mean(dim=(1, 2, 3, 4))}


class TrajectoryMetric:
    """A metric of the kind a drift proxy is: computed on every rank from the latents."""

    name, main_only, needs_trajectories = "trajectory", False, True

    def __call__(self, samples):
        return {"first_latent_sum": float(sum(s.latents[0, 0].sum() for s in samples.samples)),
                "steps_kept": float(samples.samples[0].latents.shape[1])}


def test_a_validation_step_samples_writes_and_scores_every_prompt(tmp_path):
    logged = []
    validator = make_validator(logged=logged)
    validator.add_metric(VideoScoreMetric("reward", per_video(brightness)))
    result = validator.run(4, tmp_path / "step_000004")
    # the videos are 0.5 and 0.7 everywhere: brightness is their mean 0.6, avg twice it
    assert result.metrics["Validation/brightness"] == pytest.approx(0.6)
    assert result.metrics["Validation/avg"] == pytest.approx(1.2)
    assert {"Validation/sampling_time", "Validation/reward_time", "Validation/time"} <= set(result.metrics)
    assert result.metrics["Validation/time"] >= result.metrics["Validation/sampling_time"] >= 0
    assert [s.item.seed for s in result.samples.samples] == [3, 5] and result.samples.step == 4
    # deterministic sampling of each prompt with its own seed; only x_N is kept when no metric asks for trajectories
    assert [(c[1], c[5], c[6]) for c in validator.sampler.calls] == [(3, True, False), (5, True, False)]
    assert [s.latents.shape[1] for s in result.samples.samples] == [1, 1]
    assert [float(s.latents.flatten()[0]) for s in result.samples.samples] == [5.0, 7.0]
    assert result.samples.samples[0].embeds == "embeds of a red disk at (8, 8)"
    written = sorted(p.name for p in (tmp_path / "step_000004").iterdir())
    assert written == ["sample_000_seed_3_a red disk.mp4", "sample_001_seed_5_a blue disk.mp4"]
    ((videos, step),) = logged
    assert step == 4 and [v.caption for v in videos] == ["a red disk (seed 3)", "a blue disk (seed 5)"]


def test_added_metrics_see_trajectories_and_run_on_every_rank(tmp_path):
    validator = make_validator(is_main=False)
    validator.add_metric(VideoScoreMetric("reward", per_video(brightness)))  # main only: skipped here
    validator.add_metric(TrajectoryMetric())
    result = validator.sample(1, tmp_path)
    assert [s.video for s in result.samples] == [None, None]  # only the main process decodes
    metrics = TrajectoryMetric()(result)
    assert metrics == {"first_latent_sum": 8.0, "steps_kept": 3.0}  # x_0 = 3 and 5; x_0..x_2 kept
    assert not (tmp_path / "sample_000_seed_3_a red disk.mp4").exists()
    with pytest.raises(ValueError, match="named 'trajectory' is registered already"):
        validator.add_metric(TrajectoryMetric())


def test_means_leave_failed_videos_out():
    assert mean_over_videos([{"a": 1.0, "b": math.nan}, {"a": 3.0, "b": math.nan}, {"a": math.nan}]) == {
        "a": 2.0, "b": pytest.approx(math.nan, nan_ok=True)}


def test_validation_rows_are_their_own_rows_and_tags(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log_step(1, {"gathered_avg_reward_mean": 0.5})
    logger.log_validation(1, {"Validation/avg": 0.25, "Validation/time": 1.5})
    rows = read_metrics(tmp_path)
    assert training_rows(rows) == [{"step": 1, "gathered_avg_reward_mean": 0.5}]
    assert validation_rows(rows) == [{"step": 1, "Validation/avg": 0.25, "Validation/time": 1.5}]
    assert tensorboard_tag("Validation/reward_time") == "Validation/reward_time"  # its own group, not Time/
    assert (tmp_path / "train.log").read_text().rstrip().endswith("validation at step 1 | avg 0.25 | 1.5 s")

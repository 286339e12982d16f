"""The start-up's checks that read files or build small objects, each before anything heavy loads: the prompts, the
model folder against the videos and the attention kernels, the resume, the samplers and the learning-rate schedule.
:func:`sage_grpo.startup.resolve` calls them in order; each raises one clear line (``ConfigError`` and the errors of
``trainer.USER_ERRORS``)."""

from pathlib import Path
from typing import List, Optional, Tuple

import torch

from sage_grpo.checkpoint import resumes
from sage_grpo.config.train.objective import OptimConfig
from sage_grpo.config.validation import ConfigError, TrainSections, rollout_size, validation_flow_shift
from sage_grpo.data import PromptItem, check_tasks, read_prompt_csvs, video_size
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.dtypes import DTYPES
from sage_grpo.models.attention import check_attention_runs
from sage_grpo.models.geometry import check_video_sizes, video_tokens_at
from sage_grpo.models.layout import check_model_root
from sage_grpo.optim.optimizers import LRSchedule
from sage_grpo.pipeline.sampler import Sampler, sampler_of
from sage_grpo.pipeline.validation import validation_items
from sage_grpo.resume import check_resume, restarts
from sage_grpo.rl import KLMode
from sage_grpo.startup.plan import ResumeDecision


def read_prompts(cfg: TrainSections, dims: ParallelDims,
                 notes: List[str]) -> Tuple[List[PromptItem], List[PromptItem]]:
    """(training prompts, validation prompts), read and checked: image-to-video rows need an image-to-video
    version, and under sequence parallelism every image-to-video bucket's tokens split over the SP ranks."""
    items = read_prompt_csvs(cfg.data.train_video_csv, notes=notes)
    validation = validation_items(cfg.validation)
    check_tasks(items + validation, cfg.model.pretrained_transformer_version, "--pretrained_transformer_version")
    check_i2v_tokens(cfg, dims, items)
    return items, validation


def check_i2v_tokens(cfg: TrainSections, dims: ParallelDims, items: List[PromptItem]) -> None:
    """Sequence parallelism: every image-to-video bucket's token count splits over the SP ranks (the rollout size
    was checked with the layout)."""
    if dims.sp_size == 1 or cfg.rollout.rollout_height is not None:
        return
    buckets = {video_size(item, None, cfg.rollout.video_bucket_hw_base_size, rollout_size(cfg))
               for item in items if item.task == "i2v"}
    for height, width in sorted(buckets):
        tokens = video_tokens_at(cfg, cfg.rollout.sample_n_frames, height, width)
        if tokens is not None:
            dims.check_tokens(tokens)


def check_model(cfg: TrainSections, device: torch.device) -> None:
    """The model folder (every file of the layout, its configs' structural fields, the weights' headers), the video
    sizes and frame counts against its VAE and patch size (which the first rollout would otherwise be the first to
    see), and the attention backend run on ``device`` in the compute dtype (bf16 autocast, or --dtype)."""
    check_model_root(Path(cfg.model.pretrained_model_root), cfg.model.pretrained_transformer_version)
    check_video_sizes(cfg)
    check_attention_runs(cfg.model.attention_backend, device,
                         torch.bfloat16 if cfg.model.dtype == "bf16" else DTYPES[cfg.model.dtype])


def decide_resume(cfg: TrainSections, kl_mode: KLMode, dims: ParallelDims,
                  items: List[PromptItem]) -> ResumeDecision:
    """A resume of the checkpoint ``--resume_from_checkpoint`` names (checked against this run:
    :func:`~sage_grpo.resume.check_resume`), a restart from step 0 (``auto`` in a run without a checkpoint yet), or
    a new run."""
    check = (check_resume(cfg, kl_mode, distributed=dims.is_distributed, dp_size=dims.dp_size, prompts=items)
             if resumes(cfg.output.resume_from_checkpoint, Path(cfg.output.output_dir)) else None)
    return ResumeDecision(check, check is None and restarts(cfg))


def samplers_of(cfg: TrainSections, validates: bool) -> Tuple[Sampler, Optional[Sampler]]:
    """The rollout sampler (rollout, replay and reference means sample through it) and, when validation runs, the
    validation's (its steps and shift); a schedule the SDE cannot use is refused here."""
    try:
        sampler = sampler_of(cfg)
    except ValueError as err:
        raise ConfigError(f"--sde_type {cfg.rollout.sde_type} --eta {cfg.rollout.eta}: {err}") from None
    validation = validation_sampler_of(cfg, sampler) if validates else None
    return sampler, validation


def validation_sampler_of(cfg: TrainSections, sampler: Sampler) -> Sampler:
    """The validation's deterministic sampler: the rollout's at ``--validation_num_inference_steps`` and the
    validation shift."""
    return sampler.with_schedule(cfg.validation.validation_num_inference_steps, validation_flow_shift(cfg))


def lr_schedule_of(optim: OptimConfig, total_updates: int) -> LRSchedule:
    """``--lr_scheduler`` over the run's ``total_updates`` optimizer updates (``optim``: the optimizer section)."""
    try:
        return LRSchedule(optim.lr_scheduler, optim.learning_rate, optim.warmup_steps, total_updates=total_updates,
                          num_cycles=optim.lr_num_cycles, power=optim.lr_power)
    except ValueError as err:  # e.g. polynomial decay to diffusers' 1e-7 from a smaller learning rate
        raise ConfigError(f"--lr_scheduler {optim.lr_scheduler}: {err}") from None


"""One start-up resolution: the flags, the model folder, the hardware and the memory plan turned into the run's
frozen :class:`~sage_grpo.startup.plan.RunPlan`, every check a start can make in one place, in this order, before any
model loads:

1. the numbers of the configuration, torchrun's variables, the device, the CPU threads (:mod:`.threads`), the
   weights against the machine's memory and, on GPUs, the memory plan against the GPU (:mod:`sage_grpo.plan`);
2. the variant's sampling (its guidance and validation shift where no flag sets them: ``models.variants``);
3. the processes and the parallel layout (:mod:`.processes`: every rank joins, then the layout rules);
4. the prompts, the KL mode, the drift watch, the reward configuration and its plug-ins, the trackers' packages;
5. the model folder, the video sizes, the attention backend on the device (:mod:`.checks`);
6. the resume (what it continues, and what changed) and the run directory's claim (``tracking.run_claim``);
7. the samplers, the learning-rate schedule and the memory placement.

A failure is one line naming the bad input (``trainer.USER_ERRORS``). Nothing is written: the run directory changes
only once the models and the reward have loaded (:func:`sage_grpo.startup.run_files.take_run_dir`).
"""

import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from sage_grpo import rl
from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import (check_numbers, group_layout, rollout_size, trained_steps_per_sample,
                                         validation_flow_shift, validation_size)
from sage_grpo.data import PromptItem
from sage_grpo.distributed.liveness import PeerWatch
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.models.attention import split_rows_of
from sage_grpo.models.bundle import resolve_device
from sage_grpo.models.variants import resolve_train_sampling
from sage_grpo.optim.optimizers import LRSchedule
from sage_grpo.pipeline.drift import check_watched_metrics
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.plan.fit import check_train_weights_fit
from sage_grpo.plan.memory import placement_of
from sage_grpo.plan.report import check_memory_plan
from sage_grpo.resume import run_inputs
from sage_grpo.rewards.setup import check_reward_config
from sage_grpo.rl.sde_window import SDEWindow
from sage_grpo.startup.checks import check_model, decide_resume, lr_schedule_of, read_prompts, samplers_of
from sage_grpo.startup.plan import (AttentionPlan, MemoryFigures, ParallelLayout, RunPlan, RunSubject, SamplingPlan,
                                    SchedulePlan, VideoSize)
from sage_grpo.startup.processes import start_processes
from sage_grpo.startup.threads import apply_cpu_thread_policy, threads_as_found
from sage_grpo.tracking.run_claim import RunDirPlan, config_inputs, plan_run_dir
from sage_grpo.tracking.trackers import check_report_to


@dataclass(frozen=True)
class Startup:
    """What the resolution hands the trainer: the configuration as the run uses it (the variant's sampling filled
    in), the plan, and what the checks built on the way: the processes, the prompts, the run directory's claim, the
    samplers, the learning-rate schedule and the trackers' names."""

    cfg: TrainConfig
    plan: RunPlan
    dims: ParallelDims
    peers: PeerWatch
    items: List[PromptItem]
    validation_items: List[PromptItem]
    run_claim: RunDirPlan
    sampler: Sampler
    validation_sampler: Optional[Sampler]  # None when no validation runs
    lr_schedule: LRSchedule
    report_to: Tuple[str, ...]


def resolve(cfg: TrainConfig, *, set_threads: bool = False) -> Startup:
    """The run's plan from ``cfg`` (module docstring, steps 1-7). ``set_threads``: apply the CPU thread policy and
    print its line (``post_train.py``); a run started in code keeps the caller's thread count."""
    device, threads, memory = launch_checks(cfg, set_threads)
    chosen = resolve_train_sampling(cfg.model, cfg.rollout, cfg.validation)
    cfg = cfg.replace(cfg_scale=chosen.cfg_scale, validation_timestep_shift=chosen.validation_timestep_shift)
    dims, peers, notes = start_processes(cfg, device)
    notes += chosen.notes
    for message in chosen.warnings if dims.is_main else ():
        warnings.warn(message, UserWarning, stacklevel=3)
    items, validation_items = read_prompts(cfg, dims, notes)
    kl_mode = rl.kl_mode_of(cfg.trust_region)  # decided once: every part asks this, not the flags
    drift_watch = rl.drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl_mode)
    reward = check_reward_config(cfg)  # parsed once: the reward build and the advantages take it
    check_watched_metrics(drift_watch, reward.held_out)
    notes += reward.notes
    report_to = check_report_to(cfg.output.report_to)  # names; each tracker's package imported here
    check_model(cfg, device)
    resume = decide_resume(cfg, kl_mode, dims, items)
    notes += resume.check.notes if resume.check is not None else []
    run_claim = plan_run_dir(cfg.output, dims, resume.check, resume.restart, run_inputs(cfg, resume.check),
                             config_inputs(cfg, [item.ref_image_path for item in items + validation_items]))
    schedule = schedule_of(cfg)
    sampler, validation_sampler = samplers_of(cfg, schedule.validates)
    lr_schedule = lr_schedule_of(cfg.optim, schedule.total_updates)
    sampling = SamplingPlan(chosen.cfg_scale, validation_flow_shift(cfg), chosen.warnings, chosen.notes)
    plan = RunPlan(device=device, layout=layout_of(cfg, dims), sampling=sampling, kl_mode=kl_mode,
                   drift_watch=drift_watch, reward=reward, placement=placement_of(cfg, device),
                   attention=attention_of(cfg, device), schedule=schedule, resume=resume, cpu_threads=threads,
                   memory=memory, subject=subject_of(cfg), notes=tuple(notes))
    return Startup(cfg, plan, dims, peers, items, validation_items, run_claim, sampler, validation_sampler,
                   lr_schedule, report_to)


def launch_checks(cfg: TrainConfig, set_threads: bool) -> Tuple[torch.device, str, Optional[MemoryFigures]]:
    """(device, CPU threads line, memory figures) of step 1: every number in its range before anything uses one
    (``--cpu_threads -1``), torchrun's variables before the device is chosen from ``LOCAL_RANK``, weights that cannot
    fit the machine (from the configs), and on GPUs a launch the memory plan says cannot fit."""
    check_numbers(cfg)
    read_launch_env()
    device = resolve_device(cfg)
    if set_threads:
        threads = apply_cpu_thread_policy(cfg.parallel, device)
        print(threads, flush=True)
    else:
        threads = threads_as_found(device)
    check_train_weights_fit(cfg)
    memory = check_memory_plan(cfg)
    figures = (MemoryFigures(memory.peak_gib, memory.gpu_memory_gib, memory.peak.name) if memory is not None
               else None)
    return device, threads, figures


def layout_of(cfg: TrainConfig, dims: ParallelDims) -> ParallelLayout:
    ranks_per_group, groups_per_rank = group_layout(cfg.data.batch_size, cfg.data.num_generations)
    return ParallelLayout(dims.world_size, dims.dp_size, dims.sp_size, dims.dp_replicate, ranks_per_group,
                          groups_per_rank, dims.is_distributed and cfg.parallel.enable_fsdp,
                          cfg.data.batch_size * dims.dp_size)


def attention_of(cfg: TrainConfig, device: torch.device) -> AttentionPlan:
    mode = cfg.throughput.mixed_length_attention
    return AttentionPlan(cfg.model.attention_backend, mode, split_rows_of(mode, device))


def schedule_of(cfg: TrainConfig) -> SchedulePlan:
    """The videos' sizes, the trained steps, the SDE window and the run's optimizer updates (one every
    ``--gradient_accumulation_steps`` rollout batches, ``--num_inner_epochs`` batches a step)."""
    validates = cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0
    window = SDEWindow(cfg.rollout.sde_window_size, cfg.rollout.sde_window_stride, cfg.rollout.grpo_sampling_steps)
    updates = cfg.optim.max_steps * cfg.update.num_inner_epochs // cfg.optim.gradient_accumulation_steps
    return SchedulePlan(VideoSize(*rollout_size(cfg), cfg.rollout.sample_n_frames),
                        VideoSize(*validation_size(cfg), cfg.validation.validate_video_length), validates,
                        trained_steps_per_sample(cfg), window, updates)


def subject_of(cfg: Any) -> RunSubject:
    """What the run trains and against what (the run summary's lines)."""
    reward = cfg.reward
    source = (f"remote {reward.remote_reward_url} ({reward.reward_model})" if reward.remote_reward_url
              else f"local {reward.reward_model}")
    described = f"{source}, weights {reward.reward_weights}" + (f", plus {reward.extra_rewards}"
                                                                if reward.extra_rewards else "")
    return RunSubject(cfg.output.output_dir, cfg.model.pretrained_model_root, cfg.model.pretrained_transformer_version,
                      cfg.lora.lora_r if cfg.lora.use_lora else None, cfg.model.dtype, described, cfg.optim.max_steps)

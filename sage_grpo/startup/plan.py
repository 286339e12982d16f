"""The run's plan: every decision the start-up makes (:func:`sage_grpo.startup.resolve`), frozen in one
:class:`RunPlan` that the trainer's stages read instead of the flags.

Each entry is what one question came to: the device, the parallel layout, the variant's sampling, the KL mode, the
drift watch, the reward plan, the memory placement, the attention kernels, the videos' sizes and the update schedule,
the resume, the CPU threads, the memory plan's peak against the GPU (on GPUs), and the notes for the user. The plan is
printed once when the run starts (:meth:`RunPlan.lines`) and recorded in the run directory as ``run_plan.json``
(:meth:`RunPlan.as_record`).
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from sage_grpo.models.placement import Placement
from sage_grpo.resume import ResumeCheck
from sage_grpo.rewards.setup import RewardPlan
from sage_grpo.rl import KLMode
from sage_grpo.rl.drift_guard import DriftWatch
from sage_grpo.rl.sde_window import SDEWindow


@dataclass(frozen=True)
class ParallelLayout:
    """``world = dp x sp`` (``ParallelDims``' rules, checked), FSDP's replication and how prompt groups lie on the
    data-parallel ranks (docs/reference.md#prompt-data-and-the-sampler)."""

    world_size: int
    dp_size: int
    sp_size: int
    dp_replicate: int
    ranks_per_group: int  # DP ranks one prompt group spans (G / B when B < G, else 1)
    groups_per_rank: int  # prompt groups in one rank's batch (B / G when B >= G, else 1)
    fsdp: bool  # the transformers are FSDP-sharded (--enable_fsdp on several processes)
    videos_per_step: int  # --batch_size x dp: the samples of one step over every rank


@dataclass(frozen=True)
class SamplingPlan:
    """The guidance and the validation shift the run samples with: the flags, else the variant's configs, else
    the version's table (:mod:`sage_grpo.models.variants`), and what the user is told about them."""

    cfg_scale: float
    validation_shift: float
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class AttentionPlan:
    """``--attention_backend`` (checked to run on the device in the compute dtype) and ``--mixed_length_attention``
    as decided for the device (``split_rows``: batches of prompts of other lengths are split, else masked)."""

    backend: str
    mixed_length: str
    split_rows: bool


@dataclass(frozen=True)
class VideoSize:
    height: int
    width: int
    frames: int

    def text(self) -> str:
        return f"{self.frames}x{self.height}x{self.width}"


@dataclass(frozen=True)
class SchedulePlan:
    """The videos and the update schedule: rollout and validation sizes (an image-to-video prompt's bucket may
    differ per image), whether validation runs, the (sample, step) pairs trained per sample and pass, the SDE window
    and the optimizer updates of the whole run (what the learning-rate schedule spans)."""

    rollout: VideoSize
    validation: VideoSize
    validates: bool  # --validation_interval > 0 or --validate_at_step0
    trained_steps_per_sample: int
    window: SDEWindow
    total_updates: int


@dataclass(frozen=True)
class ResumeDecision:
    """A resume (``check``: what :func:`~sage_grpo.resume.check_resume` accepted), a restart from step 0 of a run
    without a checkpoint yet (``--resume_from_checkpoint auto``), or a new run."""

    check: Optional[ResumeCheck]
    restart: bool

    @property
    def resuming(self) -> bool:
        return self.check is not None or self.restart


@dataclass(frozen=True)
class MemoryFigures:
    """The memory plan of a GPU launch: its peak phase against the GPU's memory (``sage_grpo.plan``)."""

    peak_gib: float
    budget_gib: float
    peak_phase: str


@dataclass(frozen=True)
class RunSubject:
    """What the run trains and against what: the lines a user checks first."""

    output_dir: str
    model_root: str
    transformer_version: str
    lora_rank: Optional[int]  # None: a full fine-tune
    dtype: str
    reward: str  # "local videoalign, weights {...}", or "remote URL (model), ..."
    max_steps: int


@dataclass(frozen=True)
class RunPlan:
    """Every decision of the start-up (module docstring); the stages read their entries."""

    device: torch.device
    layout: ParallelLayout
    sampling: SamplingPlan
    kl_mode: KLMode
    drift_watch: DriftWatch
    reward: RewardPlan
    placement: Placement
    attention: AttentionPlan
    schedule: SchedulePlan
    resume: ResumeDecision
    cpu_threads: str  # the line the CPU thread policy printed
    memory: Optional[MemoryFigures]  # None off CUDA or with --ignore_memory_plan
    subject: RunSubject
    notes: Tuple[str, ...] = ()

    def as_record(self) -> Dict[str, Any]:
        """The plan as JSON-able data (``run_plan.json``): every entry's fields; of the resume what was resumed and
        what changed (not the training state)."""
        record = {field.name: plain(getattr(self, field.name)) for field in dataclasses.fields(self)}
        check = self.resume.check
        record["resume"] = {"restart": self.resume.restart, "checkpoint": str(check.path) if check else None,
                            "sharded": check.sharded if check else None,
                            "at_step": check.training_state["global_step"] if check else None,
                            "differences": {k: plain(v) for k, v in check.differences.items()} if check else {}}
        return record

    def lines(self, run_dir: Path) -> List[str]:
        """The block printed once when the run starts, writing to ``run_dir``: what it trains, against what, on
        what (:func:`summary_lines`), then the decisions."""
        return summary_lines(self.subject, self.layout, self.device, run_dir) + decision_lines(self)


def plain(value: Any) -> Any:
    """``value`` as JSON data: dataclasses as mappings of their fields, sequences as lists, paths, devices and other
    objects as their text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def summary_lines(subject: RunSubject, layout: Any, device: Any, run_dir: Path) -> List[str]:
    """Where the run writes, what it trains, against what, on what (``layout``: its world, dp, sp and videos per
    step)."""
    adapters = f", LoRA r {subject.lora_rank}" if subject.lora_rank is not None else ""
    return ["run summary:",
            f"  run directory  {run_dir}",
            f"  model root     {subject.model_root} (transformer {subject.transformer_version}{adapters})",
            f"  reward         {subject.reward}",
            f"  world          {layout.world_size} process(es) = dp {layout.dp_size} x sp {layout.sp_size} on {device}",
            f"  dtype          {subject.dtype}",
            f"  steps          to {subject.max_steps}, {layout.videos_per_step} videos per step"]


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def decision_lines(plan: RunPlan) -> List[str]:
    """One line per decision of ``plan`` besides the summary's."""
    schedule, place, watch, lay = plan.schedule, plan.placement, plan.drift_watch, plan.layout
    window = (f"size {schedule.window.size}, stride {schedule.window.stride}" if schedule.window.enabled else "off")
    validation = f"validation {schedule.validation.text()}" if schedule.validates else "no validation"
    watched = ("off" if not (watch.proxy or watch.guarded) else
               f"proxy at sigmas {', '.join(map(str, watch.sigmas))}; guard {watch.action}")
    resume = plan.resume
    resumed = (f"resuming {resume.check.path} at step {resume.check.training_state['global_step']}" if resume.check
               else "restarting from step 0 (a run without a checkpoint yet)" if resume.restart else "a new run")
    sampling, kl_mode = plan.sampling, plan.kl_mode
    lines = [f"  sampling       guidance {sampling.cfg_scale:g}, validation shift {sampling.validation_shift:g}",
             f"  videos         rollout {schedule.rollout.text()}, {validation}; "
             f"{schedule.trained_steps_per_sample} trained step(s) per sample, SDE window {window}, "
             f"{schedule.total_updates} optimizer updates",
             f"  KL             {kl_mode.name} (reference model {'used' if kl_mode.uses_reference else 'none'})",
             f"  drift watch    {watched}",
             f"  placement      gradient reduction {'per_backward' if place.reduce_per_backward else 'per_update'}, "
             f"reference on {'cpu' if place.reference_on_cpu else 'device'} ({place.reference_batch_size} "
             f"transitions per forward), replay {place.replay_group_size} step(s) per forward, reward "
             f"{'in the background' if place.async_reward else 'in line'}, VAE tiling {place.vae_tiling}",
             f"  attention      {plan.attention.backend}, mixed lengths "
             f"{'split' if plan.attention.split_rows else 'masked'} (--mixed_length_attention "
             f"{plan.attention.mixed_length})",
             f"  parallel       FSDP {_on_off(lay.fsdp)}, dp_replicate {lay.dp_replicate}, a prompt group over "
             f"{lay.ranks_per_group} rank(s)",
             f"  resume         {resumed}",
             f"  {plan.cpu_threads}"]
    if plan.memory is not None:
        lines.append(f"  memory plan    peak {plan.memory.peak_gib:.1f} GB of {plan.memory.budget_gib:.1f} GB per GPU "
                     f"({plan.memory.peak_phase} phase)")
    return lines

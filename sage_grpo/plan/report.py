"""What fits, and what to tell the user: the CLI's report (``python -m sage_grpo.plan``), the largest
``--batch_size``, ``--mini_batch_size_per_update`` and ``--sample_n_frames`` that fit, and ``post_train.py``'s
check before any model loads, which names the single flag changes that would make a launch fit.

The bytes come from :mod:`sage_grpo.plan.memory`; this module only asks it questions.
"""
import argparse
import dataclasses
import sys
from typing import List, Optional, Sequence

import torch

from sage_grpo.config import ConfigError, parse_cli, validate_train_config
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.sections import value_of
from sage_grpo.config.validation import rollout_size
from sage_grpo.plan.breakdown import GIB, MemoryPlan, Phase
from sage_grpo.plan.memory import (DEFAULT_GPU_MEMORY_GIB, MARGIN, device_memory_gib, launch_world_size, plan_launch,
                                   sizes_of)
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.sizes import ModelSizes, text_token_count, video_token_count


def plan_table(plan: MemoryPlan, phase: Optional[Phase] = None) -> str:
    """``phase`` of ``plan`` (default: the peak) component by component, then every phase's total."""
    phase = phase or plan.peak
    title = f"{phase.name} phase{', the peak' if phase is plan.peak else ''}"
    lines = [f"| component ({title}) | GB | note |", "|---|---:|---|"]
    lines += [f"| {c.name} | {c.bytes / GIB:.2f} | {c.note} |" for c in phase.components if c.bytes]
    lines += [f"| **total** | **{phase.bytes / GIB:.2f}** | |"]
    lines += ["", "| phase | GB per GPU |", "|---|---:|"]
    lines += [f"| {p.name}{' (peak)' if p is plan.peak else ''} | {p.bytes / GIB:.2f} |" for p in plan.phases]
    return "\n".join(lines)


# ====================================================================== what fits

def _fits(cfg: PlanOptions, world_size: int, gpu_memory_gib: float, sizes: ModelSizes, **changes) -> bool:
    changed = cfg.replace(**changes)
    try:
        validate_train_config(changed, world_size=world_size)
        tokens = video_token_count(sizes, changed.rollout.sample_n_frames, *rollout_size(changed))
        if changed.parallel.sp_size > 1 and tokens % changed.parallel.sp_size:
            return False
    except ConfigError:
        return False
    return plan_launch(changed, world_size, gpu_memory_gib, sizes).fits()


# What the CLI searches: (flag, candidate values of cfg); memory grows with each, and the plan says which fit.
SEARCHES = (
    ("batch_size", lambda cfg: range(1, 65)),
    ("mini_batch_size_per_update",
     lambda cfg: [d for d in range(1, cfg.data.batch_size + 1) if cfg.data.batch_size % d == 0]),
    ("sample_n_frames", lambda cfg: range(1, 482, 4)),
)


def largest_fitting(cfg: PlanOptions, world_size: int, gpu_memory_gib: float, sizes: ModelSizes, flag: str,
                    candidates: Sequence[int]) -> Optional[int]:
    """The largest layout-valid value of ``flag`` among ``candidates`` whose plan fits, or None."""
    fitting = [v for v in candidates if _fits(cfg, world_size, gpu_memory_gib, sizes, **{flag: v})]
    return max(fitting) if fitting else None


def report(cfg: PlanOptions, world_size: int, gpu_memory_gib: float) -> str:
    """The CLI's text: sources, decisions, the table, what fits, and the last line ``peak per GPU: <GB> GB``."""
    sizes = sizes_of(cfg)
    plan = plan_launch(cfg, world_size, gpu_memory_gib, sizes)
    t = sizes.transformer
    placement = plan.placement
    height, width = rollout_size(cfg)
    tokens = video_token_count(sizes, cfg.rollout.sample_n_frames, height, width)
    lines = [
        f"memory plan: {world_size} GPUs of {gpu_memory_gib:g} GB, dp {world_size // cfg.parallel.sp_size} x sp "
        f"{cfg.parallel.sp_size}, "
        f"FSDP shard {world_size // cfg.parallel.dp_replicate if cfg.parallel.enable_fsdp and world_size > 1 else 1}",
        f"transformer {t.num_params / 1e9:.2f}B ({t.config['num_layers']} blocks, hidden {t.hidden}); VAE "
        f"{sizes.vae_params / 1e9:.2f}B; text encoders {sizes.text_encoder_params / 1e9:.2f}B + "
        f"{sizes.byt5_params / 1e9:.2f}B; reward {sizes.reward_params / 1e9:.2f}B",
        "configs: " + ", ".join(f"{k} from {v}" for k, v in sizes.sources.items()),
        f"video {cfg.rollout.sample_n_frames}x{height}x{width}: {tokens} latent tokens, "
        f"{tokens // cfg.parallel.sp_size} per SP rank "
        f"+ {text_token_count(cfg.model)} text tokens",
        f"decisions: gradient_reduction {'per_backward' if placement.reduce_per_backward else 'per_update'}, "
        f"reference {'cpu' if placement.reference_on_cpu else 'device'} ({placement.reference_batch_size} "
        f"transitions per forward), replay {placement.replay_group_size} trained step(s) per forward, reward "
        f"{'in the background' if placement.async_reward else 'in line'}, rollout decode "
        f"{'tiled' if placement.tile(cfg.rollout.sample_n_frames, height, width) else 'untiled'}, text encoders "
        f"{'offloaded' if cfg.parallel.offload_text_encoders else 'resident'}",
        "", plan_table(plan), "",
    ]
    train = plan.phase("train")
    if train is not plan.peak:  # the phase the gradient and activation decisions are about
        lines += [plan_table(plan, train).split("\n\n")[0], ""]
    for flag, candidates in SEARCHES:
        values = list(candidates(cfg))
        best = largest_fitting(cfg, world_size, gpu_memory_gib, sizes, flag, values)
        limit = " (the largest tried)" if best == values[-1] else ""
        lines.append(f"largest --{flag} that fits: {best if best is not None else 'none'}{limit}")
    lines.append(f"fits in {gpu_memory_gib:g} GB: {'yes' if plan.fits() else 'NO'} (auto decisions keep "
                 f"{MARGIN:.0%} free)")
    lines.append(f"peak per GPU: {plan.peak_gib:.2f} GB")
    return "\n".join(lines)


# Flag changes that lower the plan without changing what is trained, tried in this order when a launch does not fit.
MEMORY_FIXES = (("reference_placement", "cpu"), ("gradient_reduction", "per_backward"),
                ("offload_text_encoders", True), ("vae_tiling", "true"), ("enable_gradient_checkpointing", True),
                ("mini_batch_size_per_update", 1))


def memory_fixes(cfg: PlanOptions, world_size: int, gpu_memory_gib: float) -> List[str]:
    """``--flag value (peak N GB)`` for each single change of :data:`MEMORY_FIXES` with which the plan fits."""
    sizes = sizes_of(cfg)
    fixes = []
    for flag, value in MEMORY_FIXES:
        if value_of(cfg, flag) == value:
            continue
        plan = plan_launch(cfg.replace(**{flag: value}), world_size, gpu_memory_gib, sizes)
        if plan.fits():
            fixes.append(f"--{flag} {str(value).lower()} (peak {plan.peak_gib:.1f} GB)")
    return fixes


def check_memory_plan(cfg: PlanOptions) -> Optional[MemoryPlan]:
    """``post_train.py``'s check before any model loads, on CUDA devices only (a CPU run has no GPU budget): a
    ``ConfigError`` naming the flags that would make it fit, with the table, when the launch does not fit, unless
    ``--ignore_memory_plan``; a warning on stderr when it fits with less than ``MARGIN`` of the GPU free (what the
    plan cannot see, allocator fragmentation and NCCL buffers, may then not fit; refusing would stop launches that
    run)."""
    device = torch.device(cfg.parallel.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" or cfg.parallel.ignore_memory_plan:
        return None
    world_size = launch_world_size()
    validate_train_config(cfg, world_size=world_size)
    gpu = device_memory_gib(cfg)
    plan = plan_launch(cfg, world_size, gpu)
    if not plan.fits():
        fixes = memory_fixes(cfg, world_size, gpu)
        fix = ("use " + ", or ".join(fixes) if fixes else "no single placement flag is enough: fewer frames, a smaller "
               "size, a larger --sp_size or more GPUs")
        raise ConfigError(
            f"[memory-plan] the launch needs {plan.peak_gib:.1f} GB per GPU in its {plan.peak.name} phase but the GPU "
            f"has {gpu:.1f} GB (python -m sage_grpo.plan prints the whole plan). Fix: {fix}; or pass "
            f"--ignore_memory_plan true to start anyway.\n{plan_table(plan)}")
    if not plan.fits(MARGIN):
        free = gpu - plan.peak_gib
        print(f"warning: [memory-plan] the launch fits with {free:.1f} GB ({free / gpu:.0%}) of the GPU free, less "
              f"than the {MARGIN:.0%} the plan keeps for allocator fragmentation, NCCL buffers and kernel workspaces: "
              f"it may run out of memory (peak {plan.peak_gib:.1f} GB in its {plan.peak.name} phase; python -m "
              "sage_grpo.plan prints the whole plan)", file=sys.stderr, flush=True)
    return plan


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--world_size", type=int, default=None)
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--simulate_layers", type=int, default=None)
    known, rest = parser.parse_known_args(argv)
    cfg = parse_cli(TrainConfig, rest, description="Memory plan of a post_train.py launch: every post_train.py flag, "
                    "plus --world_size N (GPUs; default $WORLD_SIZE or 1), --simulate (also run the step on fake "
                    "tensors under torch's memory tracker, sage_grpo/plan/simulate.py) and --simulate_layers N (the "
                    "simulation and its plan at N blocks)")
    gpu = cfg.parallel.gpu_memory_gb if cfg.parallel.gpu_memory_gb is not None else DEFAULT_GPU_MEMORY_GIB
    try:
        for flag, value in (("--world_size", known.world_size), ("--simulate_layers", known.simulate_layers)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value} must be >= 1 (GPUs of the launch, or transformer blocks)")
        known.world_size = known.world_size or launch_world_size()  # default: $WORLD_SIZE (checked), else 1
        check_layout(cfg, known.world_size)
        print(report(cfg, known.world_size, gpu))
        simulated_fit = True
        if known.simulate or known.simulate_layers is not None:
            from sage_grpo.plan.simulate import simulation_report

            text, simulation = simulation_report(cfg, known.world_size, gpu, known.simulate_layers)
            print("\n" + text)
            simulated_fit = simulation.verdict.fits
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if not (plan_launch(cfg, known.world_size, gpu).fits() and simulated_fit):
        sys.exit(1)  # the tables say why; a script can test the status


def check_layout(cfg: PlanOptions, world_size: int) -> None:
    """The trainer's checks before any model loads (``startup.processes.start_processes``): the configuration and
    parallel layout with the transformer's head count, and every video's latent tokens split evenly over the SP ranks
    (``ConfigError``)."""
    from sage_grpo.config.validation import check_sequence_parallel_tokens, validation_size

    sizes = sizes_of(cfg)
    validate_train_config(cfg, world_size=world_size,
                          num_attention_heads=sizes.transformer.config["num_attention_heads"])
    videos = [(cfg.rollout.sample_n_frames, *rollout_size(cfg))]
    if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0:
        videos.append((cfg.validation.validate_video_length, *validation_size(cfg)))
    for frames, height, width in videos:
        check_sequence_parallel_tokens(video_token_count(sizes, frames, height, width), cfg.parallel.sp_size)


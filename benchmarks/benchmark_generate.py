"""generate.py's time and memory with each of its speed flags.

    python benchmarks/benchmark_generate.py [--geometry tiny|toy] [--steps 4] [--variants baseline,cache_deepcache]
    python benchmarks/benchmark_generate.py --geometry real --blocks 8 --device cuda --steps 20 --repeats 1   # GPU
    python benchmarks/benchmark_generate.py --geometry real --blocks 1 --vae narrow --frames 5 --height 32 --width 32 \
        --steps 2 --repeats 1 --warmup 0 --text_max_length 16   # CPU check of the real-width path

Renders one video (``VideoGenerator.render``: prompt encoding, ``--steps`` Euler ODE steps with CFG, VAE decode), as
``generate.py`` does, on a random-weight checkpoint of the geometry written to a temporary directory (``real``:
:mod:`sage_grpo.models.real_width`, the released VAE unless ``--vae narrow``; ``--checkpoint_root DIR``: one already
written), once per variant (:data:`VARIANTS`), all in one process:

* ``baseline``: no speed flag, every model on the device (``--offloading false``);
* ``attention <backend>``: ``--attention_backend`` for each other backend worth timing on the device (those whose
  package is missing or that the device cannot run are skipped, with the reason);
* ``cfg_distilled``: guidance 1.0, what a ``--cfg_distilled`` transformer samples with (one branch per step instead
  of two; the distilled weights have the base architecture, so random weights time it the same);
* ``vae_tiling``: the decode tile by tile (``vae.enable_tiling()``; generate.py has no flag, the trainer's
  ``--vae_tiling`` does this);
* ``offloading``, ``group_offloading`` (CUDA), ``sageattn`` (CUDA and its package), ``cache_deepcache``,
  ``cache_taylorcache``, ``torch_compile``: ``--offloading true``, ``--group_offloading true``,
  ``--use_sageattn true``, ``--enable_cache true --cache_type ...`` (the cache's schedule is the reference's, 11..45
  of 50 steps every 4, scaled to ``--steps``), ``--enable_torch_compile true`` (last: its compile time is unknown);
* ``step_distill``, ``sparse_attn``: accepted by generate.py but not reimplemented (always skipped).

The variants that only change what a render reads (the backend, guidance, tiling) share the baseline's loaded
models; the others install hooks or move weights and load their own, after the shared models are dropped (so each
peak is the variant's own). A variant the machine cannot run prints ``variant <name>: skipped: <reason>``, one that
fails ``variant <name>: failed: <error>`` (or ``out of memory``) and the next one runs; the others print the best
of ``--repeats`` renders after ``--warmup`` (the warm-up also compiles) and, on a GPU, the peak of
``torch.cuda.max_memory_allocated`` over the timed renders (``n/a`` on the CPU). Other generate.py flags are passed
on to every variant.
"""

import argparse
import dataclasses
import gc
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common as bench  # noqa: E402

PROMPT = "A cat walks on the grass, realistic"
NOT_REIMPLEMENTED = "generate.py accepts the flag, but the feature is not reimplemented (no effect)"
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    flags: Tuple[str, ...] = ()  # generate.py flags on top of the baseline's
    shares_models: bool = False  # rendered with the baseline's loaded models
    vae_tiling: bool = False
    skip: str = ""  # a reason it never runs


def cache_flags(steps: int, kind: str) -> Tuple[str, ...]:
    """``--enable_cache`` with the reference's schedule (full steps before 11 and from 45 of 50, every 4th in
    between) scaled to ``steps``."""
    start = max(1, round(steps * 11 / 50))
    end = max(start + 1, round(steps * 45 / 50))
    interval = max(1, min(4, (end - start) // 2))
    return ("--enable_cache", "true", "--cache_type", kind, "--cache_start_step", str(start), "--cache_end_step",
            str(end), "--cache_step_interval", str(interval), "--no_cache_block_id", "0")


def variants(steps: int, backends: List[str], unusable: Optional[Dict[str, str]] = None) -> List[Variant]:
    """Every variant, in the order they run (the shared ones first, then those that load their own models);
    ``backends``: the other usable attention backends, ``unusable``: the device's others, with the reason."""
    return [
        Variant("baseline", shares_models=True),
        *(Variant(f"attention {name}", ("--attention_backend", name), shares_models=True) for name in backends),
        *(Variant(f"attention {name}", skip=why) for name, why in (unusable or {}).items()),
        Variant("cfg_distilled", ("--guidance_scale", "1.0"), shares_models=True),
        Variant("vae_tiling", shares_models=True, vae_tiling=True),
        Variant("offloading", ("--offloading", "true")),
        Variant("group_offloading", ("--group_offloading", "true")),
        Variant("sageattn", ("--use_sageattn", "true")),
        Variant("cache_deepcache", cache_flags(steps, "deepcache")),
        Variant("cache_taylorcache", cache_flags(steps, "taylorcache")),
        Variant("torch_compile", ("--enable_torch_compile", "true")),  # last: its compile time is the unknown
        Variant("step_distill", ("--enable_step_distill", "true"), skip=NOT_REIMPLEMENTED),
        Variant("sparse_attn", ("--sparse_attn", "true"), skip=NOT_REIMPLEMENTED),
    ]


VARIANT_NAMES = tuple(v.name for v in variants(50, []))  # "attention <backend>" is chosen with "attention"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    bench.add_checkpoint_args(parser)
    parser.add_argument("--steps", type=int, default=20, help="Euler steps of a render (--num_inference_steps)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants to run (default: all; 'attention' for every other backend): "
                             + ", ".join(VARIANT_NAMES))
    parser.add_argument("--backends", default=None,
                        help="comma-separated attention backends of the 'attention' variants (default: every usable "
                             "one of the device besides --attention_backend)")
    return parser.parse_known_args(argv)


def selected(all_variants: List[Variant], wanted: Optional[str]) -> List[Variant]:
    if not wanted:
        return all_variants
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    known = set(VARIANT_NAMES) | {"attention"}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"error: --variants {','.join(unknown)}: unknown; choose from {', '.join(sorted(known))}")
    return [v for v in all_variants if v.name in names or (v.name.startswith("attention ") and "attention" in names)]


def base_flags(setup: bench.BenchSetup, root: Path, steps: int) -> List[str]:
    """generate.py flags of the baseline render at the setup's geometry."""
    frames, height, width = setup.video
    (mllm, byt5), image = setup.geometry.text_slots, setup.geometry.num_image_tokens
    return ["--model_path", str(root), "--prompt", PROMPT, "--seed", str(setup.seed), "--device", str(setup.device),
            "--dtype", bench.dtype_name(setup.dtype), "--attention_backend", setup.attention_backend,
            "--video_length", str(frames), "--fixed_size", f"{height}x{width}", "--num_inference_steps", str(steps),
            "--text_max_length", str(mllm), "--byt5_max_length", str(byt5), "--vision_num_semantic_tokens",
            str(image), "--offloading", "false", "--group_offloading", "false", "--guidance_scale", "6.0"]


def plan_variant(variant: Variant, flags: List[str], extra: List[str]):
    """(config, plan) of the variant, or a reason it cannot run here (an error or a skipped flag of the plan)."""
    from sage_grpo.config.generate import GenerateConfig
    from sage_grpo.config.schema import parse_cli
    from sage_grpo.pipeline.generation import plan_generation

    if variant.skip:
        return variant.skip
    config = parse_cli(GenerateConfig, flags + list(variant.flags) + extra)
    try:
        plan = plan_generation(config)
    except ValueError as err:
        return str(err).splitlines()[0]
    skipped = [note for note in plan.notes if "is skipped on" in note]
    return "; ".join(skipped) if skipped else (config, plan)


def measure(render: Callable[[], object], setup: bench.BenchSetup) -> Tuple[float, Optional[float]]:
    """(best seconds, peak GB over the timed renders; None off CUDA)."""
    for _ in range(setup.warmup):
        render()
    if setup.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(setup.device)
    seconds = bench.best_time(render, dataclasses.replace(setup, warmup=0))
    return seconds, bench.peak_memory_gb(setup.device)


def run_variant(variant: Variant, planned, shared, setup: bench.BenchSetup):
    """(seconds, peak GB) of the variant's render: on the shared generator with its config and plan swapped in, or
    on its own."""
    from sage_grpo.models.attention import install_joint_attention
    from sage_grpo.pipeline.generation import VideoGenerator

    config, plan = planned
    if not variant.shares_models:
        generator = VideoGenerator(config, plan)
        try:
            return measure(lambda: generator.render(plan.items[0]), setup)
        finally:
            del generator
            release(setup.device)
    baseline = (shared.config, shared.plan)
    shared.config, shared.plan = config, plan
    install_joint_attention(shared.transformer, config.attention_backend)
    shared.components.vae.use_tiling = variant.vae_tiling
    try:
        return measure(lambda: shared.render(plan.items[0]), setup)
    finally:
        shared.config, shared.plan = baseline
        install_joint_attention(shared.transformer, baseline[0].attention_backend)
        shared.components.vae.use_tiling = False


def main(argv=None) -> None:
    from sage_grpo.pipeline.generation import VideoGenerator

    args, extra = parse_args(argv)
    setup = bench.setup_from_args(args)
    setup = dataclasses.replace(setup, geometry=bench.checkpoint_geometry(setup.geometry, args))
    if args.steps < 1:
        raise SystemExit(f"error: --steps must be >= 1, got {args.steps}")
    backends, unusable = bench.usable_backends(args.backends, setup.device)
    chosen = selected(variants(args.steps, [b for b in backends if b != setup.attention_backend], unusable),
                      args.variants)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_generate_") as tmp, \
            bench.checkpoint(setup.geometry, setup.seed, args.checkpoint_root) as root:
        flags = base_flags(setup, root, args.steps) + ["--output_path", str(Path(tmp) / "video.mp4")]
        planned = {v.name: plan_variant(v, flags, extra) for v in chosen}
        baseline = plan_variant(Variant("baseline"), flags, extra)
        if isinstance(baseline, str):
            raise SystemExit(f"error: the baseline render cannot run here: {baseline}")
        shared = VideoGenerator(*baseline) if any(v.shares_models for v in chosen) else None
        for variant in chosen:
            if shared is not None and not variant.shares_models:  # its peak must not count the shared models
                shared = None
                release(setup.device)
            if isinstance(planned[variant.name], str):
                results[variant.name] = planned[variant.name]
                continue
            try:
                results[variant.name] = run_variant(variant, planned[variant.name], shared, setup)
            except Exception as err:  # noqa: BLE001 -- one variant's failure (OOM, a compile error) is its result
                results[variant.name] = "out of memory" if isinstance(err, torch.OutOfMemoryError) else \
                    f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
                release(setup.device)
    report(setup, args.steps, chosen, results)


def release(device: torch.device) -> None:
    """Free what the dropped models held, so the next variant's peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def report(setup: bench.BenchSetup, steps: int, chosen: List[Variant], results: dict) -> None:
    print(setup.describe())
    print(f"render: 1 video, {steps} Euler steps, CFG 6.0 (2 rows per step) unless the variant says otherwise; best "
          f"of {setup.repeats} after {setup.warmup} warm-up")
    base = results.get("baseline")
    for variant in chosen:
        result = results[variant.name]
        if isinstance(result, str):
            label = "" if result.startswith(("failed", "out of memory")) else "skipped: "
            print(f"variant {variant.name}: {label}{result}")
            continue
        seconds, peak = result
        ratio = f", ratio to baseline {seconds / base[0]:.3f}" if isinstance(base, tuple) else ""
        memory = f"{peak:.2f} GB" if peak is not None else "n/a"
        print(f"variant {variant.name}: {seconds:.4f} s per video, peak {memory}{ratio}")


if __name__ == "__main__":
    main()

"""Where one GRPO step's time and memory go: encode, rollout, decode, reward, reference means, policy update, optimizer
step.

    python benchmarks/benchmark_step.py [--geometry toy|tiny] [--repeats 3] [--warmup 1] [post_train.py flags]
    python benchmarks/benchmark_step.py --geometry real --blocks 8 --device cuda --repeats 2   # GPU, 81x352x624
    python benchmarks/benchmark_step.py --geometry real --blocks 1 --vae narrow --frames 5 --height 32 --width 32 \
        --steps 2 --repeats 1 --warmup 0 --use_lora true   # CPU check of the real-width path

Runs the real trainer (``GRPOTrainer``, as ``post_train.py`` does) on a random-weight checkpoint of the geometry's
configs, written to a temporary directory (``--checkpoint_root DIR``: one already written): 2 prompts x 2
generations, 8 SDE steps, the dual KL with a reference, no validation, media or checkpoints (not even the final one);
tiny and toy score with the ``target_color`` reward and run without activation checkpointing, ``real``
(HunyuanVideo-1.5's width with ``--blocks`` of its 54 blocks, the released VAE unless ``--vae narrow``, tiny text
encoders of the real widths, :mod:`sage_grpo.models.real_width`) scores with the tiny VideoAlign and checkpoints the
blocks, as the reference launch does. ``--warmup`` + ``--repeats`` steps are run; the first ``--warmup`` are left
out. Every other ``post_train.py`` flag is passed on (it overrides these settings).

The phase times are the trainer's own metrics in ``metrics.jsonl`` (``rollout_time`` = encode + rollout + decode,
``reward_time``, ``ref_model_time``, ``grpo_loop_time``); the prompt encoding and the VAE decode inside
``rollout_time`` and the optimizer step inside ``grpo_loop_time`` are timed by wrapping the model bundle's
``encode``/``decode`` and the trainer's ``optimizer_step`` (synchronizing a GPU around each).
Prints each phase's seconds (the fewest over the measured steps) and its share of their sum.

Memory: on a GPU, ``torch.cuda.max_memory_allocated`` is read and reset at each phase boundary (the rollout's peak is
what was reached between the end of the encode and the start of the decode), and each phase's largest peak over the
measured steps is printed next to the memory planner's estimate of the phase it falls in
(:func:`sage_grpo.plan.memory.plan_memory` for this trainer's configuration, placement and checkpoint, one GPU; the
decode and the reward share the planner's ``decode + reward`` phase) and the ratio measured / planned. The planner's
total includes its fixed runtime overhead (CUDA context, allocator slack), which the peak counter does not see, so the
ratio is taken against the planned total without it. On the CPU there is no peak counter: ``n/a``.
"""

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common as bench  # noqa: E402

PHASES = ("encode", "rollout", "decode", "reward", "reference means", "policy update", "optimizer step")
# the memory planner's phases (sage_grpo.plan) that each phase falls in, the first the plan has (its reference phase
# covers LoRA's too: the policy's own no-grad passes with the anchor adapter or none)
PLAN_PHASES = {"encode": ("encode",), "rollout": ("rollout",), "decode": ("decode + reward",),
               "reward": ("decode + reward",), "reference means": ("reference", "rollout"), "policy update": ("train",),
               "optimizer step": ("optimizer step",)}
RUNTIME_OVERHEAD = "runtime overhead"  # the planner's fixed component that the peak counter does not see
GIB = 2 ** 30


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    bench.add_checkpoint_args(parser)
    parser.add_argument("--steps", type=int, default=8, help="SDE steps of a rollout (--grpo_sampling_steps)")
    return parser.parse_known_args(argv)


def trainer_flags(setup: bench.BenchSetup, root: Path, out_dir: Path, sde_steps: int) -> list:
    """post_train.py flags of the benchmark run (what tests/model_fixtures.py tiny_args runs, at this geometry; at
    ``real`` the default VideoAlign reward, here the tiny one, and the blocks checkpointed, as the reference runs)."""
    frames, height, width = setup.video
    (mllm, byt5), image = setup.geometry.text_slots, setup.geometry.num_image_tokens
    real = setup.geometry.name == "real"
    reward = [] if real else ["--reward_model", "target_color", "--reward_weights", '{"target_color": 1.0}']
    return [
        "--pretrained_model_root", str(root), "--output_dir", str(out_dir), "--device", str(setup.device),
        "--dtype", bench.dtype_name(setup.dtype), "--train_video_csv", str(REPO / "assets" / "demo_train.csv"),
        "--sp_size", "1", "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", str(sde_steps),
        "--sample_n_frames", str(frames), "--rollout_height", str(height), "--rollout_width", str(width),
        "--text_max_length", str(mllm), "--byt5_max_length", str(byt5), "--vision_num_semantic_tokens", str(image),
        *reward, "--learning_rate", "1e-3",
        "--validation_interval", "0", "--save_interval", "1000000", "--save_rollout_videos", "false",
        "--enable_gradient_checkpointing", str(real).lower(), "--kl_weight", "1e-3", "--kl_coef", "1e-4",
        "--update_ref_model_step", "2", "--report_to", "none", "--attention_backend", setup.attention_backend,
        "--max_steps", str(setup.warmup + setup.repeats), "--seed", str(setup.seed),
    ]


class Stopwatch:
    """Wraps a callable, adding its (synchronized) seconds to ``seconds[step]`` for the trainer's current step."""

    def __init__(self, fn, trainer, seconds: dict, device):
        self.fn, self.trainer, self.seconds, self.device = fn, trainer, seconds, device

    def __call__(self, *args, **kwargs):
        bench.synchronize(self.device)
        start = time.perf_counter()
        result = self.fn(*args, **kwargs)
        bench.synchronize(self.device)
        step = self.trainer.global_step
        self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - start
        return result


class PhaseMemory:
    """Peak device memory per (phase, step): the CUDA peak counter is read and reset at each phase boundary
    (:meth:`wrap`); nothing is recorded on another device."""

    def __init__(self, trainer, device):
        self.trainer, self.device, self.peaks = trainer, device, {}

    def mark(self, phase=None) -> None:
        """The peak since the last mark belongs to ``phase`` (None: to no phase); the counter restarts."""
        if self.device.type != "cuda":
            return
        if phase is not None:
            key = (phase, self.trainer.global_step)
            self.peaks[key] = max(self.peaks.get(key, 0), torch.cuda.max_memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)

    def wrap(self, fn, phase: str, before=None):
        """``fn`` with a mark of ``before`` (the phase that ends where it starts) on entry and of ``phase`` on exit."""
        def wrapped(*args, **kwargs):
            self.mark(before)
            result = fn(*args, **kwargs)
            self.mark(phase)
            return result
        return wrapped

    def phase_gib(self, warmup: int) -> dict:
        """Each phase's largest peak in GB over the steps after the warm-up (global_step >= warmup); {} off CUDA."""
        out = {}
        for (phase, step), peak in self.peaks.items():
            if step >= warmup:
                out[phase] = max(out.get(phase, 0.0), peak / GIB)
        return out


def instrument(trainer, encode: dict, decode: dict, optimizer: dict) -> PhaseMemory:
    """Time the encode, decode and optimizer step (:class:`Stopwatch`) and meter every phase's memory
    (:class:`PhaseMemory`; the optimizer step runs inside the policy update, whose peak until then is the update's)."""
    memory, models = PhaseMemory(trainer, trainer.device), trainer.models
    models.encode = Stopwatch(memory.wrap(models.encode, "encode"), trainer, encode, trainer.device)
    models.decode = Stopwatch(memory.wrap(models.decode, "decode", before="rollout"), trainer, decode, trainer.device)
    trainer.optimizer_step = Stopwatch(memory.wrap(trainer.optimizer_step, "optimizer step", before="policy update"),
                                       trainer, optimizer, trainer.device)
    trainer.rewards.start = memory.wrap(trainer.rewards.start, "reward")
    trainer.reference_means = memory.wrap(trainer.reference_means, "reference means")
    trainer.policy_update = memory.wrap(trainer.policy_update, "policy update")
    return memory


def planned_memory(trainer):
    """The memory planner's plan of this trainer's run on one GPU (its configuration, placement and checkpoint)."""
    from sage_grpo.plan.memory import plan_memory, sizes_of

    device = trainer.device
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 80.0
    return plan_memory(trainer.cfg, sizes_of(trainer.cfg), 1, gpu_gib, trainer.models.placement, device.type)


def memory_line(name: str, measured_gib, plan) -> str:
    """``peak <GB|n/a>, planned <GB> (<planner phase>), measured / planned <ratio|n/a>``."""
    phase = next((plan.phase(candidate) for candidate in PLAN_PHASES[name] if plan.phase(candidate)), None)
    if phase is None:  # encode: the text encoders are resident (not offloaded), their activations not planned
        return f"peak {_gib(measured_gib)}, planned n/a (the plan has no {' or '.join(PLAN_PHASES[name])} phase)"
    allocated = (phase.bytes - sum(c.bytes for c in phase.components if c.name == RUNTIME_OVERHEAD)) / GIB
    ratio = f"{measured_gib / allocated:.3f}" if measured_gib is not None else "n/a"
    return (f"peak {_gib(measured_gib)}, planned {allocated:.2f} GB ({phase.name}, without the "
            f"{(phase.bytes / GIB) - allocated:.1f} GB runtime overhead), measured / planned {ratio}")


def _gib(value) -> str:
    return f"{value:.2f} GB" if value is not None else "n/a"


def phase_seconds(rows: list, encode: dict, decode: dict, warmup: int, optimizer: dict) -> dict:
    """Each phase's fewest seconds over the steps after the warm-up (``rows``: metrics.jsonl; steps count from 1):
    the best of the measured steps, as the other benchmarks report the best of their repeats (a shared machine's
    load only ever adds time). ``encode``, ``decode`` and ``optimizer`` are the wrapped calls' seconds by the
    trainer's global_step; the policy update is ``grpo_loop_time`` less the optimizer step."""
    measured = [row for row in rows if row["step"] > warmup]
    if not measured:
        raise SystemExit("error: no step left after the warm-up; raise --repeats")
    steps = [row["step"] - 1 for row in measured]  # the trainer's global_step while the step ran
    phases = {"encode": min(encode[step] for step in steps), "decode": min(decode[step] for step in steps),
              "rollout": min(row["rollout_time"] - encode[row["step"] - 1] - decode[row["step"] - 1]
                             for row in measured)}
    for name, key in (("reward", "reward_time"), ("reference means", "ref_model_time")):
        phases[name] = min(row[key] for row in measured)
    phases["optimizer step"] = min(optimizer.get(step, 0.0) for step in steps)
    phases["policy update"] = min(row["grpo_loop_time"] - optimizer.get(row["step"] - 1, 0.0) for row in measured)
    return {name: phases[name] for name in PHASES}


def main(argv=None) -> None:
    from sage_grpo.config import parse_cli
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.tracking.run_dir import read_metrics
    from sage_grpo.trainer import GRPOTrainer

    args, extra = parse_args(argv)
    setup = bench.setup_from_args(args)
    setup = dataclasses.replace(setup, geometry=bench.checkpoint_geometry(setup.geometry, args))
    encode, decode, optimizer = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp, \
            bench.checkpoint(setup.geometry, setup.seed, args.checkpoint_root) as root:
        cfg = parse_cli(TrainConfig, trainer_flags(setup, root, Path(tmp) / "run", args.steps) + extra)
        trainer = GRPOTrainer(cfg)
        plan = planned_memory(trainer)
        loaded = sum(p.numel() for name, p in trainer.models.policy.named_parameters() if "lora_" not in name)
        memory = instrument(trainer, encode, decode, optimizer)
        # train() ends with a checkpoint (fp32 weights and optimizer state: ~13 GB at 8 real-width blocks), which is
        # no phase of a step: not written here
        trainer.save = lambda: None
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        rows = read_metrics(trainer.run_dir)
        planned_params = plan_sizes_line(trainer.cfg, loaded)
    phases = phase_seconds(rows, encode, decode, setup.warmup, optimizer)
    peaks = memory.phase_gib(setup.warmup)
    total = sum(phases.values())
    print(setup.describe())
    print(f"trainer: batch {cfg.data.batch_size} x {cfg.data.num_generations} generations, {cfg.rollout.grpo_sampling_steps} SDE "
          f"steps, {cfg.rollout.sample_n_frames}x{cfg.rollout.rollout_height}x{cfg.rollout.rollout_width} videos, reward "
          f"{cfg.reward.reward_model}; {len(rows)} steps in {wall:.2f} s, the first {setup.warmup} left out")
    print(planned_params)
    for name, seconds in phases.items():
        print(f"{name}: {seconds:.4f} s, {100 * seconds / total:.1f}% of the step")
    print(f"step (sum of the phases, each the best of {len(rows) - setup.warmup} steps): {total:.4f} s")
    for name in PHASES:
        print(f"memory {name}: {memory_line(name, peaks.get(name), plan)}")
    measured_peak = max(peaks.values()) if peaks else None
    print(f"memory step: peak {_gib(measured_peak)}, planned {plan.peak_gib:.2f} GB ({plan.peak.name}, with the "
          "runtime overhead)")


def plan_sizes_line(cfg, loaded: int) -> str:
    """The planner's transformer size, read from the checkpoint's configs, next to the loaded policy's: equal for a
    full fine-tune (the plan is of the reduced depth)."""
    from sage_grpo.plan.memory import sizes_of

    sizes = sizes_of(cfg)
    transformer = sizes.transformer
    return (f"planner sizes: transformer {transformer.num_params} parameters ({transformer.config['num_layers']} "
            f"blocks; the loaded policy has {loaded} besides LoRA), VAE {sizes.vae_params}, "
            f"reward {sizes.reward_params}")


if __name__ == "__main__":
    main()

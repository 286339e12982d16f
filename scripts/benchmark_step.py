"""Where one GRPO step's time goes: encode, rollout, decode, reward, reference means, policy update (issue 13, item 8).

    python scripts/benchmark_step.py [--geometry toy|tiny] [--repeats 3] [--warmup 1] [post_train.py flags]
    python scripts/benchmark_step.py --geometry toy --device cuda --dtype bf16 --sample_n_frames 33   # GPU

Runs the real trainer (``GRPOTrainer``, as ``post_train.py`` does) on a random-weight checkpoint of the geometry's
configs, written to a temporary directory: 2 prompts x 2 generations, 8 SDE steps, the dual KL with a reference,
the ``target_color`` reward, no validation, checkpoints or media. ``--warmup`` + ``--repeats`` steps are run; the
first ``--warmup`` are left out. Every other ``post_train.py`` flag is passed on (it overrides these settings).

The phase times are the trainer's own metrics in ``metrics.jsonl`` (``rollout_time`` = encode + rollout + decode,
``reward_time``, ``ref_model_time``, ``grpo_loop_time``); the prompt encoding and the VAE decode inside
``rollout_time`` are timed by wrapping the model bundle's ``encode``/``decode`` (synchronizing a GPU around each).
Prints each phase's seconds (the fewest over the measured steps) and its share of their sum.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sage_grpo import bench  # noqa: E402

PHASES = ("encode", "rollout", "decode", "reward", "reference means", "policy update")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    parser.add_argument("--steps", type=int, default=8, help="SDE steps of a rollout (--grpo_sampling_steps)")
    return parser.parse_known_args(argv)


def trainer_flags(setup: bench.BenchSetup, root: Path, out_dir: Path, sde_steps: int) -> list:
    """post_train.py flags of the benchmark run (what tests/model_fixtures.py tiny_args runs, at this geometry)."""
    frames, height, width = setup.video
    (mllm, byt5), image = setup.geometry.text_slots, setup.geometry.num_image_tokens
    return [
        "--pretrained_model_root", str(root), "--output_dir", str(out_dir), "--device", str(setup.device),
        "--dtype", bench.dtype_name(setup.dtype), "--train_video_csv", str(REPO / "assets" / "demo_train.csv"),
        "--sp_size", "1", "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", str(sde_steps),
        "--sample_n_frames", str(frames), "--rollout_height", str(height), "--rollout_width", str(width),
        "--text_max_length", str(mllm), "--byt5_max_length", str(byt5), "--vision_num_semantic_tokens", str(image),
        "--reward_model", "target_color", "--reward_weights", '{"target_color": 1.0}', "--learning_rate", "1e-3",
        "--validation_interval", "0", "--save_interval", "1000000", "--save_rollout_videos", "false",
        "--enable_gradient_checkpointing", "false", "--kl_weight", "1e-3", "--kl_coef", "1e-4",
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


def phase_seconds(rows: list, encode: dict, decode: dict, warmup: int) -> dict:
    """Each phase's fewest seconds over the steps after the warm-up (``rows``: metrics.jsonl; steps count from 1):
    the best of the measured steps, as the other benchmarks report the best of their repeats (a shared machine's
    load only ever adds time)."""
    measured = [row for row in rows if row["step"] > warmup]
    if not measured:
        raise SystemExit("error: no step left after the warm-up; raise --repeats")
    steps = [row["step"] - 1 for row in measured]  # the trainer's global_step while the step ran
    phases = {"encode": min(encode[step] for step in steps), "decode": min(decode[step] for step in steps),
              "rollout": min(row["rollout_time"] - encode[row["step"] - 1] - decode[row["step"] - 1]
                             for row in measured)}
    for name, key in (("reward", "reward_time"), ("reference means", "ref_model_time"),
                      ("policy update", "grpo_loop_time")):
        phases[name] = min(row[key] for row in measured)
    return {name: phases[name] for name in PHASES}


def main(argv=None) -> None:
    from sage_grpo.config import TrainConfig, parse_cli
    from sage_grpo.tracking import read_metrics
    from sage_grpo.trainer import GRPOTrainer

    args, extra = parse_args(argv)
    setup = bench.setup_from_args(args)
    if not setup.geometry.write_checkpoint:
        raise SystemExit("error: --geometry real: the step benchmark runs the trainer on a written checkpoint; use "
                         "--geometry toy or tiny (a real checkpoint: pass --pretrained_model_root after them)")
    encode, decode = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp, bench.checkpoint(setup.geometry, setup.seed) as root:
        cfg = parse_cli(TrainConfig, trainer_flags(setup, root, Path(tmp) / "run", args.steps) + extra)
        trainer = GRPOTrainer(cfg)
        models = trainer.models
        models.encode = Stopwatch(models.encode, trainer, encode, trainer.device)
        models.decode = Stopwatch(models.decode, trainer, decode, trainer.device)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        rows = read_metrics(trainer.run_dir)
    phases = phase_seconds(rows, encode, decode, setup.warmup)
    total = sum(phases.values())
    print(setup.describe())
    print(f"trainer: batch {cfg.batch_size} x {cfg.num_generations} generations, {cfg.grpo_sampling_steps} SDE "
          f"steps, {cfg.sample_n_frames}x{cfg.rollout_height}x{cfg.rollout_width} videos, reward "
          f"{cfg.reward_model}; {len(rows)} steps in {wall:.2f} s, the first {setup.warmup} left out")
    for name, seconds in phases.items():
        print(f"{name}: {seconds:.4f} s, {100 * seconds / total:.1f}% of the step")
    print(f"step (sum of the phases, each the best of {len(rows) - setup.warmup} steps): {total:.4f} s")


if __name__ == "__main__":
    main()

"""Each throughput lever against the step without it: the reward off the critical path (``--async_reward``),
grouped replay (``--replay_group_size``) and the CFG pair without a key mask (``--mixed_length_attention split``).

    python benchmarks/benchmark_levers.py --config tiny --lever replay --repeats 3 --warmup 1
    python benchmarks/benchmark_levers.py --config toy --lever reward --reward remote --server_cores 1

Two trainers of the same run (``configs/<config>_cpu.yaml`` on a random-weight checkpoint of its geometry, written to a
temporary directory: what is timed does not depend on the weights) are built in this process, one with the lever off
and one with it on, and their steps interleave (off, on, off, on, ...), so both see the same load on a shared machine.
Each step's wall time, process CPU time (every thread: the reward worker's too) and the training thread's CPU time
are read around ``train_step``; the first ``--warmup`` steps of each are left out and the medians of the others are
printed with their ratio on / off. On a machine shared with other jobs the wall time mostly measures their load; the
CPU times do not. The training thread's CPU time is the step's critical path when the reward worker has a core of its
own and finishes within the reference pass (a wait for a reward server costs no CPU: its benefit shows in the wall
time only).

The reward lever scores with the tiny VideoAlign (``sage_grpo/rewards/tiny.py``, the real code path at a few
milliseconds per frame) instead of the config's toy reward, whose 0.5 ms would leave nothing to overlap: ``--reward
local`` in the trainer's process (the worker thread; pin the process to two cores), ``--reward remote`` on a reward
server (``scripts/reward_server.py``) started here on ``--server_cores`` (``taskset``). Every other
``post_train.py`` flag given is passed to both trainers.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common as bench  # noqa: E402

# what is read around each step: the wall clock, the process's CPU time (every thread) and the training thread's
MEASURES = ("step wall", "process CPU", "training thread CPU")
# lever -> (flags off, flags on)
LEVERS = {
    "reward": (["--async_reward", "false"], ["--async_reward", "true"]),
    "replay": (["--replay_group_size", "1"], ["--replay_group_size", "{group}"]),
    "attention": (["--mixed_length_attention", "mask"], ["--mixed_length_attention", "split"]),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--config", choices=("tiny", "toy"), default="tiny", help="configs/<config>_cpu.yaml")
    parser.add_argument("--lever", choices=tuple(LEVERS), required=True)
    parser.add_argument("--group", type=int, default=0, help="--replay_group_size of the on run (0: every step)")
    parser.add_argument("--reward", choices=("local", "remote"), default="local",
                        help="the reward lever's tiny VideoAlign: in this process or on a reward server")
    parser.add_argument("--server_cores", default="1", help="taskset cores of the reward server (--reward remote)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each trainer (medians printed)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each trainer first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (--cpu_threads)")
    return parser.parse_known_args(argv)


def trainer_flags(args, root: Path, out_dir: Path) -> list:
    """The config's flags on the benchmark's checkpoint, without media, checkpoints or validation."""
    flags = ["--config", str(REPO / "configs" / f"{args.config}_cpu.yaml"), "--pretrained_model_root", str(root),
             "--output_dir", str(out_dir), "--report_to", "none", "--quiet", "--save_interval", "1000000",
             "--validation_interval", "0", "--save_rollout_videos", "false", "--cpu_threads", str(args.threads),
             "--max_steps", str(args.warmup + args.repeats)]
    if args.config == "toy":
        flags += ["--train_video_csv", str(REPO / "assets" / "toy_train.csv")]
    if args.lever == "reward":
        flags += ["--reward_model", "videoalign_local", "--reward_weights", "", "--dtype", "fp32"]
    return flags


def start_server(args, root: Path):
    """(process, url) of a reward server on ``--server_cores`` scoring the tiny VideoAlign in fp32."""
    command = ["taskset", "-c", args.server_cores, sys.executable, str(REPO / "scripts" / "reward_server.py"),
               "--pretrained_model_root", str(root), "--port", "0", "--dtype", "fp32", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                              start_new_session=True)
    for line in server.stdout:
        if "serving reward" in line:
            return server, line.split(" on ")[-1].strip()
    raise SystemExit("error: the reward server did not start")


def step_times(trainer) -> tuple:
    """(wall, process CPU, training thread CPU) seconds of one outer step, as ``GRPOTrainer.train`` runs it."""
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    trainer.maybe_refresh_anchor()
    trainer.train_step()
    trainer.global_step += 1
    return time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread


def main(argv=None) -> None:
    from sage_grpo.config import parse_cli
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.rewards.tiny import write_tiny_video_reward
    from sage_grpo.trainer import GRPOTrainer

    args, extra = parse_args(argv)
    torch.set_num_threads(args.threads)
    geometry = bench.GEOMETRIES[args.config]
    off, on = LEVERS[args.lever]
    server = None
    with tempfile.TemporaryDirectory(prefix="bench_levers_") as tmp, bench.checkpoint(geometry) as root:
        if args.lever == "reward":
            write_tiny_video_reward(root)
        if args.reward == "remote" and args.lever == "reward":
            server, url = start_server(args, root)
            extra = extra + ["--remote_reward_url", url]
        try:
            trainers = {}
            for name, flags in (("off", off), ("on", on)):
                base = parse_cli(TrainConfig, trainer_flags(args, root, Path(tmp) / name) + extra)
                steps = args.group or base.rollout.grpo_sampling_steps
                cfg = parse_cli(TrainConfig, trainer_flags(args, root, Path(tmp) / name) + extra
                                + [flag.format(group=steps) for flag in flags])
                trainers[name] = GRPOTrainer(cfg)
            times = {name: [] for name in trainers}
            for _ in range(args.warmup + args.repeats):
                for name, trainer in trainers.items():
                    times[name].append(step_times(trainer))
            for trainer in trainers.values():
                trainer.rewards.close()
        finally:
            if server is not None:
                server.kill()
                server.wait()
    cfg = trainers["on"].cfg
    print(f"config {args.config} ({geometry.name} geometry, random weights): batch {cfg.data.batch_size}, "
          f"{cfg.rollout.grpo_sampling_steps} SDE steps, mini-batch {cfg.parallel.mini_batch_size_per_update}, CFG {cfg.rollout.cfg_scale}, "
          f"reward {cfg.reward.reward_model}{' (remote)' if cfg.reward.remote_reward_url else ''}, {args.threads} torch thread(s), "
          f"lever {args.lever}: off {' '.join(off)}, on {' '.join(flag.format(group=cfg.throughput.replay_group_size) for flag in on)}")
    medians = {}
    for name, rows in times.items():
        measured = rows[args.warmup:]
        medians[name] = [statistics.median(row[i] for row in measured) for i in range(3)]
        print(f"{name}: " + ", ".join(f"{label} {' '.join(f'{row[i]:.3f}' for row in measured)} s (median "
                                      f"{medians[name][i]:.3f})" for i, label in enumerate(MEASURES)))
    print("ratio on / off: " + ", ".join(f"{label} {medians['on'][i] / medians['off'][i]:.3f}"
                                        for i, label in enumerate(MEASURES)))


if __name__ == "__main__":
    main()

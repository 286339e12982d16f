"""The drift guard on toy rewards it was not tuned on: every run of the study and its table (docs/toy_study.md,
"Drift guard").

    python scripts/drift_guard_study.py                   # the full study (hours on one core): writes the table
    python scripts/drift_guard_study.py --quick           # minutes: toy_large and toy_mix, seed 0, 12 steps
    python scripts/drift_guard_study.py --report          # the table again from the runs on disk, nothing trained

Each run trains ``configs/toy_cpu.yaml`` (the demo) with one reward and one arm: ``none`` (no KL, ``--steps``) or
``demo`` (the demo's trust region, its own 25 steps), validating at step 0 and every ``--every`` steps on the 8
held-out prompts of ``assets/toy_drift_valid.csv`` with ``--drift_guard warn`` at its defaults (1 torch thread).
The rewards: ``toy_large`` and the four of :mod:`sage_grpo.rewards.toy_drift_rewards` the first round of defaults was
fixed on, and the four of :mod:`sage_grpo.rewards.toy_check_rewards`: two written after the first round (the second
round was fixed on them too), two after the second. The guard is replayed over each run's
``metrics.jsonl`` (:mod:`sage_grpo.studies.guard_study`; checked against what the run's own guard logged), once as
validated and once keeping every second validation point (a run validated half as often), and compared with the toy
world's truth. A finished run is not trained again (``--fresh`` to do so); ``--jobs N`` trains N runs at a time, each
in a process of its own.

Writes ``<runs>/drift_guard_study.json`` and ``<runs>/drift_guard_table.md``, and (the full study) the generated
section ``drift_guard`` of docs/toy_study.md.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.rewards.registry import register_reward  # noqa: E402
from sage_grpo.rewards.toy_check_rewards import CHECK_REWARDS, CHECK_WEIGHTS, SECOND_CHECK_REWARDS  # noqa: E402
from sage_grpo.rewards.toy_drift_rewards import STUDY_REWARDS, STUDY_WEIGHTS  # noqa: E402
from sage_grpo.rl.drift_guard import drift_watch_of  # noqa: E402
from sage_grpo.rl.kl import NO_KL  # noqa: E402
from sage_grpo.safe_io import atomic_write  # noqa: E402
from sage_grpo.studies.guard_study import TABLE_HEAD, live_matches, outcome, replay, summary, table_row  # noqa: E402
from sage_grpo.studies.study import base_config, replace_generated  # noqa: E402
from sage_grpo.tracking.run_dir import read_metrics, training_rows  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ARMS = {"none": dict(kl_weight=0.0), "demo": {}}  # no KL; the demo's own trust region (dual moving KL, beta 0.1)
TUNING = ("toy_large", *STUDY_REWARDS)  # the rewards the first round of defaults was fixed on
CHECK = tuple(CHECK_REWARDS)  # written after the first round; the second round was fixed on these too
SECOND_CHECK = tuple(SECOND_CHECK_REWARDS)  # written after the second round
ALL = TUNING + CHECK + SECOND_CHECK
WEIGHTS = {**{name: {name: 1.0} for name in ALL}, **STUDY_WEIGHTS, **CHECK_WEIGHTS}  # a mixture's terms, else the score
DONE = "study_run.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs/toy_cpu.yaml"))
    parser.add_argument("--rewards", nargs="+", default=None, help="default: the tuning set, then the check set")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20, help="steps of the runs without KL")
    parser.add_argument("--demo_steps", type=int, default=None, help="steps of the demo arm (default: the config's)")
    parser.add_argument("--every", type=int, default=2, help="validation interval (steps)")
    parser.add_argument("--valid_csv", default=str(REPO / "assets/toy_drift_valid.csv"))
    parser.add_argument("--runs", default=str(REPO / "outputs/drift_guard_study"))
    parser.add_argument("--doc", default=str(REPO / "docs/toy_study.md"), help="the report (full study only)")
    parser.add_argument("--quick", action="store_true", help="toy_large and toy_mix, seed 0, 12 steps each arm")
    parser.add_argument("--report", action="store_true", help="only the table, from the runs on disk")
    parser.add_argument("--fresh", action="store_true", help="train finished runs again")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time, each in its own process")
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)  # reward:arm:seed, one run (a --jobs child)
    args = parser.parse_args(argv)
    if args.quick:
        args.rewards, args.seeds, args.steps, args.demo_steps = args.rewards or ["toy_large", "toy_mix"], [0], 12, 12
        args.runs = args.runs if args.runs != str(REPO / "outputs/drift_guard_study") else args.runs + "_quick"
    args.rewards = args.rewards or list(ALL)
    unknown = [r for r in args.rewards if r not in WEIGHTS]
    if unknown:
        parser.error(f"--rewards {' '.join(unknown)}: not a reward of the study; use some of {', '.join(WEIGHTS)}")
    if args.every < 1 or args.jobs < 1:
        parser.error(f"--every {args.every} and --jobs {args.jobs} must be >= 1")
    return args


def register() -> None:
    for name, cls in {**STUDY_REWARDS, **CHECK_REWARDS, **SECOND_CHECK_REWARDS}.items():
        register_reward(name, cls)


def run_dir(args, reward: str, arm: str, seed: int) -> Path:
    return Path(args.runs) / f"{reward}-{arm}-seed{seed}"


def train_one(args, reward: str, arm: str, seed: int) -> None:
    """One run of the study, in this process."""
    import torch

    from sage_grpo.trainer import GRPOTrainer

    torch.set_num_threads(1)
    register()
    steps = args.steps if arm == "none" else args.demo_steps
    overrides = dict(seed=seed, reward_model=reward, reward_weights=json.dumps(WEIGHTS[reward]),
                     validation_interval=args.every, valid_video_csv=[args.valid_csv], validate_at_step0=True,
                     drift_guard="warn", save_rollout_videos=False, overwrite_output_dir=True, report_to=["none"],
                     quiet=True, cpu_threads=1, output_dir=str(run_dir(args, reward, arm, seed)), **ARMS[arm])
    if steps is not None:
        overrides.update(max_steps=steps, save_interval=steps)
    cfg = base_config(args.config, **overrides)
    torch.manual_seed(seed)
    start = time.perf_counter()
    trainer = GRPOTrainer(cfg)
    with trainer.peers.guard("training"):
        trainer.train()
    atomic_write(trainer.run_dir / DONE, json.dumps({"reward": reward, "arm": arm, "seed": seed,
                                                     "steps": cfg.optim.max_steps, "every": args.every,
                                                     "wall_s": time.perf_counter() - start}))


def runs(args) -> List[Tuple[str, str, int]]:
    return [(reward, arm, seed) for reward in args.rewards for arm in args.arms for seed in args.seeds]


def train_all(args) -> None:
    """Every run not finished yet (or all, ``--fresh``), ``--jobs`` at a time in processes of their own."""
    todo = [run for run in runs(args) if args.fresh or not (run_dir(args, *run) / DONE).is_file()]
    running: List[Tuple[subprocess.Popen, Tuple]] = []
    log_dir = Path(args.runs)
    log_dir.mkdir(parents=True, exist_ok=True)
    while todo or running:
        while todo and len(running) < args.jobs:
            reward, arm, seed = todo.pop(0)
            command = [sys.executable, __file__, "--only", f"{reward}:{arm}:{seed}", "--runs", args.runs,
                       "--config", args.config, "--steps", str(args.steps), "--every", str(args.every),
                       "--valid_csv", args.valid_csv] + (["--demo_steps", str(args.demo_steps)]
                                                         if args.demo_steps is not None else [])
            print(f"[{time.strftime('%H:%M:%S')}] {reward}, {arm}, seed {seed}", flush=True)
            with open(log_dir / f"{reward}-{arm}-seed{seed}.log", "w") as log:  # the child keeps its own handle
                running.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True), (reward, arm, seed)))
        try:
            time.sleep(2)
        except KeyboardInterrupt:  # each run is a process group of its own: stop them too (a rerun redoes them)
            for process, _ in running:
                os.killpg(process.pid, signal.SIGTERM)
            raise
        for process, run in list(running):
            if process.poll() is not None:
                running.remove((process, run))
                if process.returncode:
                    print(f"  {run} failed (exit {process.returncode}): see {log_dir}/{'-'.join(map(str, run))}.log")


def outcomes(args) -> Dict[str, dict]:
    """Each finished run's outcome, as validated and validated half as often."""
    cfg = base_config(args.config)
    bounds = drift_watch_of(cfg.drift, 1, False, NO_KL).bounds
    results = {}
    for reward, arm, seed in runs(args):
        folder = run_dir(args, reward, arm, seed)
        if not (folder / DONE).is_file():
            print(f"  {folder}: not finished, left out")
            continue
        rows = read_metrics(folder)
        points = replay(rows, bounds)
        if not live_matches(points):
            print(f"  {folder}: the run's own guard logged other findings than the replay (another version's run?)")
        steps = max(row["step"] for row in training_rows(rows))
        wall = json.loads((folder / DONE).read_text()).get("wall_s", 0.0)
        results[f"{reward}, {arm}, seed {seed}"] = {"reward": reward, "steps": steps, "wall": wall,
                                                    "full": outcome(points),
                                                    "sparse": outcome(replay(rows, bounds, every=2))}
    return results


def table(args, results: Dict[str, dict]) -> str:
    lines = []
    for title, names in (("The rewards the first round of defaults was fixed on", TUNING),
                         ("Written after the first round, and the second round fixed on them too", CHECK),
                         ("Written after the second round (the defaults)", SECOND_CHECK)):
        chosen = {k: v for k, v in results.items() if v["reward"] in names}
        if not chosen:
            continue
        lines += [f"**{title}** ({', '.join(n for n in names if n in args.rewards)}): "
                  f"{summary({k: v['full'] for k, v in chosen.items()})}.", "", TABLE_HEAD]
        lines += [table_row(name, r["full"], r["sparse"]) for name, r in chosen.items()]
        lines.append("")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    walls = sorted(r["wall"] for r in results.values()) or [0.0]
    lines.append(f"Generated {time.strftime('%Y-%m-%d')} by `python scripts/drift_guard_study.py"
                 f"{' --quick' if args.quick else ''}` on {machine}, 1 torch thread per run: {len(walls)} runs, "
                 f"{sum(walls) / 60:.0f} min of run wall time in all (median {walls[len(walls) // 2]:.0f} s a run).")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.only:
        reward, arm, seed = args.only.split(":")
        train_one(args, reward, arm, int(seed))
        return 0
    if not args.report:
        train_all(args)
    results = outcomes(args)
    text = table(args, results)
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(args.runs) / "drift_guard_table.md", text + "\n")
    atomic_write(Path(args.runs) / "drift_guard_study.json", json.dumps(
        {k: {"reward": v["reward"], "full": vars(v["full"]), "sparse": vars(v["sparse"])} for k, v in results.items()},
        indent=1))
    if not args.quick and set(args.rewards) == set(ALL) and len(results) == len(runs(args)):
        doc = Path(args.doc)
        atomic_write(doc, replace_generated(doc.read_text(), {"drift_guard": text}, str(doc)))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

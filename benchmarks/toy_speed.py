"""Time to reward on the toy world: how many steps, model FLOPs, process CPU seconds and wall seconds each
learning-per-rollout setting needs until the 5-step mean reward first reaches a target (0.9) on the demo's task.

    OMP_NUM_THREADS=1 python benchmarks/toy_speed.py --arms default k2 k4 window frac05 --seeds 0
    python benchmarks/toy_speed.py --report docs/toy_speed_table.md      # table + plot from the saved results

Each arm trains ``configs/toy_cpu.yaml`` (the demo; it needs ``ckpts/toy`` from scripts/make_toy_checkpoint.py) in
this process, one arm after the other, with the arm's flags, rollout media and validation off (the same for every
arm), until the target is reached or ``--max_steps``. Counted per outer step (the trainer's ``train_step``; start-up,
model loading and checkpoints are left out): wall seconds, this process's CPU seconds (``time.process_time``: less
sensitive than wall time to other processes on a shared machine), and model FLOPs: the rows every transformer
forward sees (policy and KL reference, counted by a forward pre-hook) times the FLOPs of one row (measured once with
``torch.utils.flop_counter`` on a recorded forward), a forward under autograd counted 3x (forward + backward). The
VAE decode and the (analytic) toy reward are not counted. With the target reached, the manifold error is the 5-step
mean of the rollouts' ``manifold_error`` over the same steps. Results go to ``<runs>/<arm>_seed<k>/speed.json``.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sage_grpo.config.train import TrainConfig  # noqa: E402
from sage_grpo.config.schema import from_dict, load_yaml  # noqa: E402
from sage_grpo.tracking.run_dir import manifold_error_key, read_metrics  # noqa: E402

ARMS: Dict[str, Dict] = {  # name -> post_train.py settings that differ from configs/toy_cpu.yaml
    "default": {},
    "k2": {"num_inner_epochs": 2},
    "k4": {"num_inner_epochs": 4},
    "window": {"sde_window_size": 4, "sde_window_stride": 2},
    "frac05": {"timestep_fraction": 0.5},
    "window2": {"sde_window_size": 2, "sde_window_stride": 2},
    "window4_fixed": {"sde_window_size": 4, "sde_window_stride": 0},  # the 4 noisiest steps, never moving
    "window4_slow": {"sde_window_size": 4, "sde_window_stride": 4},
    "window_frac05": {"sde_window_size": 4, "sde_window_stride": 2, "timestep_fraction": 0.5},
    "k2_window": {"num_inner_epochs": 2, "sde_window_size": 4, "sde_window_stride": 2},
    "k4_frac05": {"num_inner_epochs": 4, "timestep_fraction": 0.5},
    "k2_moving": {"num_inner_epochs": 2, "use_dual_kl": False},
    "k4_moving": {"num_inner_epochs": 4, "use_dual_kl": False},
    "k2_clip1e3": {"num_inner_epochs": 2, "clip_range": 1e-3},  # a wider PPO clip, so later passes keep a gradient
    # the step-wise KL against the rollout's policy (the drift since the rollout) instead of the paper's previous step
    "k2_rollout_kl": {"num_inner_epochs": 2, "stepwise_kl_reference": "rollout"},
    "k4_rollout_kl": {"num_inner_epochs": 4, "stepwise_kl_reference": "rollout"},
    # the equalizer inside a window: the whole schedule's scales or renormalised over the window's steps
    "window4_slow_eq_full": {"sde_window_size": 4, "sde_window_stride": 4, "sde_window_equalizer": "full"},
    "window4_slow_eq_window": {"sde_window_size": 4, "sde_window_stride": 4, "sde_window_equalizer": "window"},
    "window_eq_full": {"sde_window_size": 4, "sde_window_stride": 2, "sde_window_equalizer": "full"},
    "window_eq_window": {"sde_window_size": 4, "sde_window_stride": 2, "sde_window_equalizer": "window"},
}
WINDOW = 5
REWARD_KEY = "gathered_avg_reward_mean"


class ForwardCounter:
    """Rows through a transformer's forward (x3 under autograd), and one recorded forward to price a row."""

    def __init__(self, module):
        self.module, self.rows, self.sample = module, 0, None
        self.handle = module.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        rows = hidden.shape[0]
        self.rows += rows * (3 if torch.is_grad_enabled() else 1)
        if self.sample is None:
            clone = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            self.sample = (rows, tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()})

    def flops_per_row(self) -> float:
        rows, args, kwargs = self.sample
        self.handle.remove()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            self.module(*args, **kwargs)
        return counter.get_total_flops() / rows


def run_arm(name: str, seed: int, args) -> Dict:
    from sage_grpo.trainer import GRPOTrainer

    values = load_yaml(args.config)
    values.update(ARMS[name], seed=seed, max_steps=args.max_steps, save_interval=10 ** 6, validation_interval=0,
                  validate_at_step0=False, save_rollout_videos=False, report_to=["none"],
                  output_dir=str(Path(args.runs) / f"{name}_seed{seed}"), overwrite_output_dir=True)
    cfg = from_dict(TrainConfig, values, source=args.config)
    trainer = GRPOTrainer(cfg)
    counters = [ForwardCounter(trainer.models.policy)]
    if trainer.models.reference is not None:
        counters.append(ForwardCounter(trainer.models.reference))
    steps: List[Dict] = []
    inner_step = trainer.train_step

    def timed_step():
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = inner_step()
        steps.append({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                      "rows": [c.rows for c in counters], "reward": metrics[REWARD_KEY]})
        rewards = [s["reward"] for s in steps[-WINDOW:]]
        if len(rewards) == WINDOW and statistics.fmean(rewards) >= args.target:
            trainer.cfg.optim.max_steps = trainer.global_step + 1  # this is the last step
        return metrics

    trainer.train_step = timed_step
    trainer.train()
    rows = read_metrics(trainer.run_dir)
    price = [c.flops_per_row() for c in counters]
    flops, wall, cpu = [], 0.0, 0.0
    for step in steps:
        wall, cpu = wall + step["wall"], cpu + step["cpu"]
        flops.append(sum(r * p for r, p in zip(step["rows"], price)))
        step.update(cum_wall=wall, cum_cpu=cpu, cum_flops=flops[-1])
    means = [statistics.fmean(r[REWARD_KEY] for r in rows[i - WINDOW:i]) for i in range(WINDOW, len(rows) + 1)]
    reached = next((i + WINDOW for i, m in enumerate(means) if m >= args.target), None)
    key = manifold_error_key(rows)
    result = {"arm": name, "seed": seed, "flags": ARMS[name], "target": args.target, "reached_at_step": reached,
              "best_5step_reward": max(means) if means else float("nan"), "steps": steps}
    if reached is not None:
        last = steps[reached - 1]
        result.update(wall=last["cum_wall"], cpu=last["cum_cpu"], flops=last["cum_flops"],
                      manifold_error=statistics.fmean(r[key] for r in rows[reached - WINDOW:reached]) if key else None)
    out = Path(cfg.output.output_dir) / "speed.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"{name} seed {seed}: reached {args.target} at step {reached}, "
          f"cpu {result.get('cpu', float('nan')):.0f} s, wall {result.get('wall', float('nan')):.0f} s", flush=True)
    return result


def report(args) -> None:
    """The markdown table (mean and spread over seeds) and the reward-vs-FLOPs/CPU-time plot."""
    from sage_grpo.tracking.plots import Panel, Series, plot_panels

    results: Dict[str, List[Dict]] = {}
    for path in sorted(Path(args.runs).glob("*/speed.json")):
        data = json.loads(path.read_text())
        results.setdefault(data["arm"], []).append(data)
    base = results.get("default", [])

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    def spread(values, form="{:.0f}", scale=1.0):
        """'mean ± std' over the seeds that have the value (population std), 'n/a' for none."""
        values = [v / scale for v in values if v is not None]
        if not values:
            return "n/a"
        text = form.format(statistics.fmean(values))
        return text + (f" ± {form.format(statistics.pstdev(values))}" if len(values) > 1 else "")

    base_cpu, base_flops = mean([r.get("cpu") for r in base]), mean([r.get("flops") for r in base])
    lines = ["| arm | flags | seeds | reached at step | model TFLOPs | CPU s | wall s | CPU vs default | FLOPs vs "
             "default | manifold error (max) | best 5-step reward |", "|" + "---|" * 11]
    for name in [a for a in ARMS if a in results]:
        runs = results[name]
        done = [r for r in runs if r["reached_at_step"] is not None]
        cpu, flops = mean([r.get("cpu") for r in done]), mean([r.get("flops") for r in done])
        reached = ", ".join(str(r["reached_at_step"] or f"not in {len(r['steps'])}") for r in runs)
        if done:
            cost = (spread([r["flops"] for r in done], "{:.2f}", 1e12), spread([r["cpu"] for r in done]),
                    spread([r["wall"] for r in done]), f"{cpu / base_cpu:.2f}x" if base_cpu else "n/a",
                    f"{flops / base_flops:.2f}x" if base_flops else "n/a",
                    spread([r["manifold_error"] for r in done], "{:.4f}")
                    + f" ({max(r['manifold_error'] for r in done):.4f})")
        else:  # not reached: what the whole run cost, as a lower bound
            spent = [r["steps"][-1] for r in runs]
            cost = (f"> {mean([s['cum_flops'] for s in spent]) / 1e12:.2f}",
                    f"> {mean([s['cum_cpu'] for s in spent]):.0f}", "n/a", "n/a", "n/a", "n/a")
        flags = " ".join(f"--{k} {v}" for k, v in runs[0]["flags"].items()) or "(demo)"
        lines.append(f"| {name} | {flags} | {','.join(str(r['seed']) for r in runs)} | {reached} | "
                     + " | ".join(cost) + f" | {spread([r['best_5step_reward'] for r in runs], '{:.3f}')} |")
    Path(args.report).write_text("\n".join(lines) + "\n")
    curves = {"flops": [], "cpu": [], "wall": []}
    for name, runs in results.items():
        steps = runs[0]["steps"]  # the first seed's curve
        smooth = [statistics.fmean(s["reward"] for s in steps[max(0, i - WINDOW + 1):i + 1]) for i in range(len(steps))]
        curves["flops"].append(Series(name, [s["cum_flops"] / 1e12 for s in steps], smooth))
        curves["cpu"].append(Series(name, [s["cum_cpu"] for s in steps], smooth))
        curves["wall"].append(Series(name, [s["cum_wall"] for s in steps], smooth))
    plot_panels([Panel(f"5-step mean reward (target {args.target}) vs model TFLOPs", "reward", curves["flops"],
                       "model TFLOPs"),
                 Panel("5-step mean reward vs process CPU seconds", "reward", curves["cpu"], "CPU seconds"),
                 Panel("5-step mean reward vs wall seconds", "reward", curves["wall"], "wall seconds")],
                Path(args.report).with_suffix(".png"), title="time to reward on the toy")
    print("\n".join(lines))


def kl_report(args) -> None:
    """Fixed-length runs (``--target`` out of reach) compared at their end: the step-wise KL's effect at K > 1."""
    from sage_grpo.tracking.run_dir import read_metrics as rows_of

    def cell(values, form="{:.3f}"):
        values = [v for v in values if v is not None]
        if not values:
            return "n/a (not computed)"
        text = form.format(statistics.fmean(values))
        return text + (f" ± {form.format(statistics.pstdev(values))}" if len(values) > 1 else "")

    lines = ["| arm | flags | seeds | steps | final 5-step reward | best 5-step reward | manifold error, last 5 steps "
             "(max seed) | manifold error, max step | step-wise KL, last pass (median) | clipfrac, last pass "
             "(median) |", "|" + "---|" * 10]
    runs: Dict[str, List] = {}
    for path in sorted(Path(args.runs).glob("*/speed.json")):
        data = json.loads(path.read_text())
        runs.setdefault(data["arm"], []).append((data, rows_of(path.parent)))
    for name in [a for a in ARMS if a in runs]:
        final, best, drift, worst, stepwise, clipped = [], [], [], [], [], []
        for data, rows in runs[name]:
            key = manifold_error_key(rows)
            last = f"inner_epoch_{data['flags'].get('num_inner_epochs', 1) - 1}/"
            final.append(statistics.fmean(r[REWARD_KEY] for r in rows[-WINDOW:]))
            best.append(data["best_5step_reward"])
            drift.append(statistics.fmean(r[key] for r in rows[-WINDOW:]))
            worst.append(max(r[key] for r in rows))
            kept = [r.get(last + "kl_stepwise", r.get("kl_stepwise")) for r in rows]
            stepwise.append(statistics.median(kept) if None not in kept else None)
            clipped.append(statistics.median(r.get(last + "clipfrac", r["clipfrac"]) for r in rows))
        flags = " ".join(f"--{k} {v}" for k, v in runs[name][0][0]["flags"].items()) or "(demo)"
        seeds = ",".join(str(d["seed"]) for d, _ in runs[name])
        lines.append(f"| {name} | {flags} | {seeds} | {len(runs[name][0][1])} | {cell(final)} | {cell(best)} | "
                     f"{cell(drift, '{:.4f}')} ({max(drift):.4f}) | {max(worst):.4f} | "
                     f"{cell(stepwise, '{:.2e}')} | {cell(clipped, '{:.2f}')} |")
    Path(args.kl_report).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["default", "k2", "k4", "window", "frac05"], choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--config", default=str(REPO / "configs/toy_cpu.yaml"))
    parser.add_argument("--max_steps", type=int, default=40, help="give up after this many steps")
    parser.add_argument("--target", type=float, default=0.9, help="the 5-step mean reward to reach")
    parser.add_argument("--runs", default=str(REPO / "outputs/toy_speed"))
    parser.add_argument("--report", default=None, help="write the table (markdown) and plot (.png) from --runs")
    parser.add_argument("--kl_report", default=None, help="write the fixed-length comparison (markdown) from --runs")
    args = parser.parse_args(argv)
    if args.kl_report:
        kl_report(args)
        return 0
    if args.report:
        report(args)
        return 0
    for seed in args.seeds:
        for name in args.arms:
            run_arm(name, seed, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

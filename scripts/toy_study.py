"""The paper's claims measured on the toy world: SDE types, KL modes and the equalizer, plus an analytic part.

    python scripts/toy_study.py            # the full study: 3 seeds per arm (under an hour on 2 cores)
    python scripts/toy_study.py --quick    # a few minutes: 1 seed, fewer steps, the SDE ablation only

Needs the toy checkpoint (the committed one, installed by ``bash scripts/demo_cpu.sh`` or ``python
scripts/make_toy_checkpoint.py --committed``; installed here if missing). Writes ``docs/toy_study.md`` (``docs/toy_study_quick.md`` with --quick), the PNG curves next to it
and the raw numbers as JSON; runs go to ``outputs/toy_study/``. An existing report keeps everything outside its
generated sections (the hand-written verdict and time-to-reward section; ``sage_grpo.toy.study.write_report``).
"""

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sage_grpo import sde  # noqa: E402
from sage_grpo.data import read_prompt_csvs  # noqa: E402
from sage_grpo.tracking.plots import Panel, Series, plot_panels  # noqa: E402
from sage_grpo.toy import analytic  # noqa: E402
from sage_grpo.toy.study import (ablation_arms, base_config, check_report, mean_spread, run_key,  # noqa: E402
                                  run_one, write_report)

REPO = Path(__file__).resolve().parents[1]
ETAS = (0.3, 0.5, 0.7, 1.0)
ANALYTIC_STEPS, ANALYTIC_SHIFT = 20, 5.0  # the reference's rollout schedule


def analytic_part(num_samples: int, etas=ETAS) -> dict:
    mixture = analytic.GaussianMixture.on_a_plane()
    sigmas = sde.shifted_sigmas(ANALYTIC_STEPS, ANALYTIC_SHIFT)
    results = {"sigmas": [float(s) for s in sigmas], "ode": analytic.terminal_errors(mixture, None, 0.0, sigmas,
                                                                                   num_samples), "sde": {}}
    for sde_type in sde.SDE_TYPES:
        for eta in etas:
            results["sde"][f"{sde_type}@{eta}"] = {
                "noise_std": analytic.noise_std_per_step(sde_type, eta, sigmas),
                "one_step_variance_error": analytic.one_step_variance_errors(mixture, sde_type, eta, sigmas,
                                                                             num_samples),
                **analytic.terminal_errors(mixture, sde_type, eta, sigmas, num_samples),
            }
    return results


def analytic_markdown(results: dict, png: Path) -> list:
    lines = ["## Analytic part: exact velocities, every SDE against the exact marginals", "",
             "Data: a mixture of 4 Gaussians (std 0.15) on a circle in 2 of 16 coordinates, std "
             f"{analytic.OFF_MANIFOLD_STD} in the other 14 (the *off-manifold* coordinates). The rectified-flow "
             "velocity of such data is known in closed form (`sage_grpo/toy/analytic.py`), so the samplers run on the "
             "exact velocity and every error below is the sampler's own. Schedule: the reference's 20 steps with "
             "shift 5.", "",
             "- *one-step variance error*: from exact samples at σ_k, one SDE step; the relative error of the "
             "variance of the off-manifold coordinates against the exact marginal at σ_{k+1} (0 = marginal kept "
             "exactly), the worst and the mean |error| over the first 19 steps (on the last step the exact variance "
             "is the data's 1e-4, so any noise is a huge relative error: the terminal columns show that step);",
             "- *terminal*: sampling from σ = 1 to 0; RMS of the off-manifold coordinates (the data has "
             f"{analytic.OFF_MANIFOLD_STD}) and the sliced W2 distance to the data "
             f"(ODE with the exact velocity: off-manifold RMS {results['ode']['off_manifold_rms']:.4f}, sliced W2 "
             f"{results['ode']['sliced_w2']:.4f}).", "",
             "| SDE | η | noise std step 0 / 10 / 19 | one-step variance error: worst, mean "
             "| terminal off-manifold RMS | terminal sliced W2 |", "|---|---|---|---|---|---|"]
    for key, row in results["sde"].items():
        sde_type, eta = key.split("@")
        std = row["noise_std"]
        errors = row["one_step_variance_error"][:-1]
        worst = max(errors, key=abs)
        lines.append(f"| {sde_type} | {eta} | {std[0]:.3f} / {std[10]:.3f} / {std[-1]:.3f} | {worst:+.3f}, "
                     f"{sum(abs(e) for e in errors) / len(errors):.3f} | {row['off_manifold_rms']:.4f} | "
                     f"{row['sliced_w2']:.4f} |")
    lines += ["", f"![noise std per step]({png.name})", ""]
    return lines


def analytic_plot(results: dict, path: Path) -> None:
    sigmas = results["sigmas"][:-1]
    panels = []
    for eta in (0.5, 1.0):
        keys = [k for k in results["sde"] if k.endswith(f"@{eta}")]
        if keys:
            panels.append(Panel(f"injected noise std per step (η = {eta}) against σ_k", "noise std",
                                [Series(k.split("@")[0], sigmas, results["sde"][k]["noise_std"]) for k in keys],
                                x_label="σ_k"))
            panels.append(Panel(f"one-step variance error of the off-manifold coordinates (η = {eta}), steps 0-18",
                                "rel. error", [Series(k.split("@")[0], sigmas[:-1],
                                                      results["sde"][k]["one_step_variance_error"][:-1])
                                               for k in keys], x_label="σ_k"))
    plot_panels(panels, path, title="Analytic part: samplers on the exact velocity of Gaussian-mixture data")


def run_ablations(args, prompts, log) -> dict:
    base = base_config(args.config, max_steps=args.steps, save_interval=args.steps, validation_interval=0,
                       validate_at_step0=False, save_rollout_videos=False, overwrite_output_dir=True)
    done, results = {}, {}
    arms = [arm for arm in ablation_arms() if arm.ablation in args.ablations]
    for arm in arms:
        for seed in args.seeds:
            name = f"{arm.ablation}-{arm.name.replace(' ', '_')}-seed{seed}"
            cfg = replace(base, seed=seed, output_dir=str(Path(args.runs) / name), **arm.overrides)
            key = run_key(cfg)
            if key not in done:
                log(f"[{time.strftime('%H:%M:%S')}] {arm.ablation}: {arm.name}, seed {seed}")
                torch.manual_seed(seed)
                done[key] = run_one(cfg, prompts, args.window, log)
            results.setdefault(arm.ablation, {}).setdefault(arm.name, []).append(done[key])
    return results


COLUMNS = (("reward_gain", "reward gain", 3), ("manifold_last", "rollout manifold error (last steps)", 4),
           ("eval_reward", "eval reward (ODE)", 3), ("eval_manifold_error", "eval manifold error (ODE)", 4),
           ("eval_prompt_adherence", "eval prompt adherence", 2), ("kl_to_pretrained", "KL to pretrained", 4),
           ("wall_seconds", "wall time (s)", 0))


def ablation_markdown(results: dict, window: int, out_dir: Path) -> list:
    titles = {"sde": "SDE type (dual moving KL, equalizer on)", "kl": "KL mode (sage_grpo, equalizer on)",
              "equalizer": "Gradient-norm equalizer (sage_grpo, dual moving KL)"}
    lines = []
    for ablation, arms in results.items():
        lines += [f"## {titles[ablation]}", "",
                  "| arm | " + " | ".join(label for _, label, _ in COLUMNS) + " |",
                  "|---|" + "---|" * len(COLUMNS)]
        for arm, runs in arms.items():
            lines.append(f"| {arm} | " + " | ".join(mean_spread([r[k] for r in runs], digits)
                                                    for k, _, digits in COLUMNS) + " |")
        png = out_dir / f"toy_study_{ablation}.png"
        panels = [Panel(f"{ablation}: GRPO reward per step (mean over seeds; band: std over seeds)", "reward"),
                  Panel(f"{ablation}: rollout manifold error per step", "RMS")]
        for arm, runs in arms.items():
            for panel, key in zip(panels, ("reward_curve", "manifold_curve")):
                curves = torch.tensor([r[key] for r in runs])
                steps = list(range(1, curves.shape[1] + 1))
                panel.series.append(Series(arm, steps, curves.mean(0).tolist(),
                                           curves.std(0, unbiased=False).tolist()))
        plot_panels(panels, png, title=f"Toy study: {titles[ablation]}")
        lines += ["", f"![{ablation}]({png.name})", ""]
    lines.insert(0, f"Reward gain: mean `gathered_avg_reward_mean` of the last {window} steps minus the first "
                    f"{window}. Cells: mean ± std over seeds.\n")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 8 steps, the SDE ablation; a few minutes")
    parser.add_argument("--config", default=str(REPO / "configs/toy_cpu.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default 20, quick 8)")
    parser.add_argument("--ablations", nargs="+", default=None, choices=("sde", "kl", "equalizer"))
    parser.add_argument("--analytic_samples", type=int, default=None)
    parser.add_argument("--runs", default=str(REPO / "outputs/toy_study"), help="where the runs are written")
    parser.add_argument("--output", default=None, help="markdown report (default docs/toy_study[_quick].md)")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    args.steps = args.steps or (8 if args.quick else 20)
    args.window = min(5, max(args.steps // 4, 1))
    args.ablations = args.ablations or (["sde"] if args.quick else ["sde", "kl", "equalizer"])
    samples = args.analytic_samples or (2000 if args.quick else 20000)
    output = Path(args.output or REPO / ("docs/toy_study_quick.md" if args.quick else "docs/toy_study.md"))
    output.parent.mkdir(parents=True, exist_ok=True)
    try:  # refused now rather than after the study: an existing report whose generated parts are not marked
        check_report(output)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(min(2, torch.get_num_threads()))

    base = base_config(args.config)
    if not (Path(base.model.pretrained_model_root) / ".complete").is_file():
        subprocess.run([sys.executable, str(REPO / "scripts/make_toy_checkpoint.py"), "--committed", "--output",
                        base.model.pretrained_model_root], check=True)
    prompts = [item.prompt for item in read_prompt_csvs(base.data.train_video_csv)]
    start = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] analytic part ({samples} samples per measurement)", flush=True)
    analytic_results = analytic_part(samples, ETAS if not args.quick else (0.5, 1.0))
    analytic_png = output.with_name(output.stem + "_analytic.png")
    analytic_plot(analytic_results, analytic_png)
    results = run_ablations(args, prompts, lambda message: print(message, flush=True))
    minutes = (time.perf_counter() - start) / 60

    command = "python scripts/toy_study.py" + (" --quick" if args.quick else "")
    header = [f"# Toy study{' (quick)' if args.quick else ''}: the paper's claims on the toy world", "",
              f"Reproduce: `{command}` (needs the toy checkpoint of `bash scripts/demo_cpu.sh`). Measured on "
              f"{date.today().isoformat()} on {platform.processor() or platform.machine()} with "
              f"{torch.get_num_threads()} threads, torch {torch.__version__}; the whole study took {minutes:.0f} min.",
              "", f"Each run: `{Path(args.config).resolve().relative_to(REPO)}` (the demo's settings) for "
              f"{args.steps} GRPO steps, seeds {args.seeds}, overrides per arm as named. Eval: ODE samples of the "
              "final policy for the training prompts x 2 seeds; KL to pretrained: the exact path KL per latent "
              "element between the final policy and the pretrained model under the `sage_grpo` SDE at η = 0.5 "
              "on the policy's rollouts."]
    body = ablation_markdown(results, args.window, output.parent) + analytic_markdown(analytic_results, analytic_png)
    write_report(output, {"header": "\n".join(header), "results": "\n".join(body)})
    raw = output.with_suffix(".json")
    raw.write_text(json.dumps({"analytic": analytic_results, "ablations": results, "seeds": args.seeds,
                               "steps": args.steps}, indent=1))
    print(f"wrote {output}, {raw} and the PNGs next to them ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

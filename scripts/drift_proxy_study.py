"""Which drift proxy tracks the toy world's true manifold error? Every candidate of ``sage_grpo.rl.drift`` measured on
the validation samples of the toy study's KL arms, at every validation point, against the ground truth.

    python scripts/drift_proxy_study.py                       # no KL, fixed (20 steps), the demo (25) x seeds 0 1 2
    python scripts/drift_proxy_study.py --seeds 0 --steps 6   # a quick look

Each run trains ``configs/toy_cpu.yaml`` (the demo: dual moving KL, 25 steps) with the arm's KL flags (no KL and the
fixed anchor for ``--steps``) and, at step 0 and every ``--every`` steps, runs the trainer's own validation of the
8 held-out prompts of ``assets/toy_drift_valid.csv`` (deterministic ODE samples, scored by the reward alone, with
the drift proxy and the drift guard at their defaults, ``--drift_guard warn``); then it samples the same prompts again and measures on them: the
true manifold error (``sage_grpo.toy.manifold``: the ground truth, which a real run does not have), the reward, and
the candidates, all computed from the policy, the frozen base model and the
samples only: the base model's denoising error at several noise levels, the path KL to the base policy along the
validation trajectories (the training SDE on the validation schedule), the paired RMS distance to the base model's
own samples of the same prompts and seeds (latents and pixels), the energy distance between the two sets, and every
proxy of the drift-proxy table (``sage_grpo/pipeline/drift_proxies.py``) at the run's ``--drift_proxy_sigmas``.

Writes the raw rows (one per validation sample) to ``<runs>/drift_proxy_study.json`` and prints the Spearman rank
correlation of each candidate with the true manifold error: over the validation points (each the mean over its
samples; every arm, seed and step) and over the single samples.

It also prints, per run, from the trainer's own validation rows (``metrics.jsonl``), the validation step at which the
manifold error of the validation samples first reaches ``--crossing`` and the step of the drift guard's first alarm.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sage_grpo.config.validation import validation_size  # noqa: E402
from sage_grpo.data import read_prompt_csvs  # noqa: E402
from sage_grpo.models.loading import load_transformer  # noqa: E402
from sage_grpo.pipeline.drift import base_denoising_errors, trajectory_path_kl  # noqa: E402
from sage_grpo.pipeline.drift_proxies import DRIFT_PROXIES, drift_proxy  # noqa: E402
from sage_grpo.rl.drift import energy_distance, paired_rms, spearman  # noqa: E402
from sage_grpo.toy.manifold import fit_manifold  # noqa: E402
from sage_grpo.studies.study import base_config  # noqa: E402
from sage_grpo.tracking.run_dir import read_metrics, validation_rows  # noqa: E402
from sage_grpo.trainer import GRPOTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ARMS = {"none": dict(kl_weight=0.0), "fixed": dict(use_moving_KL=False, use_dual_kl=False),
        "demo": dict(use_moving_KL=True, use_dual_kl=True)}  # the demo: dual moving KL, its own 25 steps
LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)


class ProbedTrainer(GRPOTrainer):
    """The trainer, its validation (the drift proxy and guard included) followed by the probe."""

    def __init__(self, cfg, probe):
        super().__init__(cfg)
        self.probe = probe

    def validate(self, step: int):
        result = super().validate(step)
        self.probe(self, step)
        return result


class Probe:
    """Measures every candidate on the validation samples; the base model's own samples are drawn once."""

    def __init__(self, base, rows: List[Dict], tags: Dict):
        self.base, self.rows, self.tags = base, rows, tags
        self.base_samples = None  # (latents (B, C, T, h, w), videos (B, 3, F, H, W)), the same for every run

    def sample(self, trainer, model):
        cfg, sampler = trainer.cfg, trainer.validation_sampler
        trajectories, embeds = [], []
        for item in trainer.validation_items:
            embeds.append(trainer._encode([item], validation_size(cfg)))
            trajectories.append(sampler.rollout(model, trainer.models.vae, embeds[-1], [item.seed],
                                                num_frames=cfg.validation.validate_video_length, height=validation_size(cfg)[0],
                                                width=validation_size(cfg)[1], deterministic=True,
                                                decode=False).latents)
        return trajectories, embeds

    @torch.no_grad()
    def __call__(self, trainer, step: int) -> None:
        start = time.perf_counter()
        policy, sampler, items = trainer.models.policy, trainer.validation_sampler, trainer.validation_items
        policy.eval()
        if self.base_samples is None:
            trajectories, _ = self.sample(trainer, self.base)
            finals = torch.cat([t[:, -1] for t in trajectories])
            self.base_samples = finals, trainer.models.decode(finals)
        trajectories, embeds = self.sample(trainer, policy)
        finals = torch.cat([t[:, -1] for t in trajectories])
        videos = trainer.models.decode(finals)
        truth = fit_manifold(videos).error
        prompts = [item.prompt for item in items]
        rewards = trainer.reward_fn(videos, prompts)["avg"]
        base_latents, base_videos = self.base_samples
        latent_rms, pixel_rms = paired_rms(finals, base_latents), paired_rms(videos, base_videos)
        point = {"energy_latent": float(energy_distance(finals, base_latents)),
                 "energy_pixel": float(energy_distance(videos, base_videos))}
        for i, item in enumerate(items):
            errors = base_denoising_errors(self.base, sampler, finals[i:i + 1], embeds[i], [item.seed], LEVELS)[0]
            path_kl = trajectory_path_kl(policy, self.base, sampler, trajectories[i], embeds[i])
            sigmas = trainer.cfg.drift.drift_proxy_sigmas  # every proxy of the table, at the run's noise levels
            table = {f"proxy_{name}": float(drift_proxy(name)(self.base, sampler, finals[i:i + 1], embeds[i],
                                                               [item.seed], sigmas).mean()) for name in DRIFT_PROXIES}
            self.rows.append({**self.tags, "step": step, "sample": i, "manifold_error": float(truth[i]),
                              "reward": float(rewards[i]), "path_kl": float(path_kl[0]),
                              "paired_rms_latent": float(latent_rms[i]), "paired_rms_pixel": float(pixel_rms[i]),
                              **{f"denoise_{s}": float(e) for s, e in zip(LEVELS, errors)}, **table, **point})
        policy.train()
        print(f"  step {step}: manifold error {truth.mean():.4f}, reward {rewards.mean():.3f}, "
              f"{time.perf_counter() - start:.1f} s", flush=True)


def denoise_mean(row: Dict, levels) -> float:
    return sum(row[f"denoise_{s}"] for s in levels) / len(levels)


CANDIDATES = {
    **{f"denoising error σ={s}": (lambda row, s=s: row[f"denoise_{s}"]) for s in LEVELS},
    "denoising error, mean of σ 0.25/0.5/0.75": lambda row: denoise_mean(row, (0.25, 0.5, 0.75)),
    "denoising error, mean of σ 0.5/0.75/0.9": lambda row: denoise_mean(row, (0.5, 0.75, 0.9)),
    "denoising error, mean of all levels": lambda row: denoise_mean(row, LEVELS),
    "path KL to the base": lambda row: row["path_kl"],
    "paired RMS to base samples (latent)": lambda row: row["paired_rms_latent"],
    "paired RMS to base samples (pixels)": lambda row: row["paired_rms_pixel"],
    "energy distance to base samples (latent)": lambda row: row["energy_latent"],
    "energy distance to base samples (pixels)": lambda row: row["energy_pixel"],
    **{f"table proxy {name}": (lambda row, name=name: row[f"proxy_{name}"]) for name in DRIFT_PROXIES},
}


def correlations(rows: List[Dict]) -> Dict[str, Dict[str, float]]:
    """Spearman of each candidate with the manifold error: over validation points (means) and over samples."""
    points: Dict[tuple, List[Dict]] = {}
    for row in rows:
        points.setdefault((row["arm"], row["seed"], row["step"]), []).append(row)
    result = {}
    for name, value in CANDIDATES.items():
        means = [(sum(value(r) for r in group) / len(group), sum(r["manifold_error"] for r in group) / len(group))
                 for group in points.values()]
        per_sample = name.startswith("energy") is False
        result[name] = {"points": spearman([m[0] for m in means], [m[1] for m in means]),
                        "samples": (spearman([value(r) for r in rows], [r["manifold_error"] for r in rows])
                                    if per_sample else float("nan"))}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs/toy_cpu.yaml"))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=2, help="validation interval (steps)")
    parser.add_argument("--valid_csv", default=str(REPO / "assets/toy_drift_valid.csv"))
    parser.add_argument("--runs", default=str(REPO / "outputs/drift_proxy_study"))
    parser.add_argument("--report", nargs="+", default=None, help="only print the results of earlier JSONs")
    parser.add_argument("--crossing", type=float, default=0.15, help="the manifold error the guard should flag")
    args = parser.parse_args(argv)
    if args.report:
        runs = [json.loads(Path(path).read_text()) for path in args.report]
        rows, guarded = [r for run in runs for r in run["rows"]], [g for run in runs for g in run.get("guard", [])]
    else:
        rows, guarded = run_study(args)
    for name, values in correlations(rows).items():
        print(f"{name:45s} points {values['points']:+.3f}   samples {values['samples']:+.3f}")
    for run in guarded:
        print(f"{run['arm']}, seed {run['seed']}: manifold error >= {args.crossing} first at step {run['crossing']}, "
              f"first drift guard alarm at step {run['first_alarm']}; at most {run['max_manifold_error']:.4f} and "
              f"{run['max_proxy_ratio']:.2f}x")
    return 0


def guard_outcome(run_dir: Path, crossing: float) -> Dict:
    """From the trainer's validation rows: when the manifold error first reaches ``crossing``, when the guard first
    raised an alarm, and the largest manifold error and proxy ratio."""
    rows = validation_rows(read_metrics(run_dir))
    error = next(key for key in rows[0] if key.endswith("_manifold_error"))
    return {"crossing": next((r["step"] for r in rows if r[error] >= crossing), None),
            "first_alarm": next((r["step"] for r in rows if r["Validation/drift_guard_alarms"] > 0), None),
            "max_manifold_error": max(r[error] for r in rows),
            "max_proxy_ratio": max(r["Validation/drift_proxy_ratio"] for r in rows)}


def run_study(args) -> Tuple[List[Dict], List[Dict]]:
    torch.set_num_threads(1)
    base_cfg = base_config(args.config, validation_interval=args.every, valid_video_csv=[args.valid_csv],
                           validate_at_step0=True, validation_metrics=None, drift_guard="warn", save_rollout_videos=False, overwrite_output_dir=True,
                           report_to=["none"], quiet=True)
    read_prompt_csvs(base_cfg.validation.valid_video_csv)  # a bad CSV fails before any run
    base = load_transformer(base_cfg.model.pretrained_model_root, base_cfg.model.pretrained_transformer_version, torch.float32,
                            "cpu").eval()
    rows: List[Dict] = []
    guarded: List[Dict] = []
    output = Path(args.runs) / "drift_proxy_study.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    probe = Probe(base, rows, {})
    for arm in args.arms:
        for seed in args.seeds:
            print(f"[{time.strftime('%H:%M:%S')}] {arm}, seed {seed}", flush=True)
            probe.tags = {"arm": arm, "seed": seed}
            steps = base_cfg.optim.max_steps if arm == "demo" else args.steps
            cfg = base_cfg.replace(seed=seed, output_dir=str(Path(args.runs) / f"{arm}-seed{seed}"), max_steps=steps,
                                   save_interval=steps, **ARMS[arm])
            torch.manual_seed(seed)
            trainer = ProbedTrainer(cfg, probe)
            with trainer.peers.guard("training"):
                trainer.train()
            guarded.append({"arm": arm, "seed": seed, **guard_outcome(trainer.run_dir, args.crossing)})
            output.write_text(json.dumps({"args": vars(args), "rows": rows, "guard": guarded}, indent=0))
    return rows, guarded


if __name__ == "__main__":
    sys.exit(main())

"""The toy study: the paper's claims measured on the toy world (``scripts/toy_study.py`` runs it).

Ablations, each arm run with several seeds at a fixed budget from ``configs/toy_cpu.yaml`` (the demo's settings):

- the four SDE types with the dual moving KL;
- the five KL modes of the paper's ablation (none, fixed, moving, dual fixed, dual moving) with ``sage_grpo``;
- ``sage_grpo`` with and without the gradient-norm equalizer.

Per run: the reward gain (mean ``gathered_avg_reward_mean`` of the last ``window`` steps minus the first
``window``), the manifold error of the last ``window`` steps' rollouts, and, on a fixed evaluation set after
training, ODE samples of the final policy (reward, manifold error, prompt adherence) and the KL from the pretrained
model (:func:`path_kl`), plus the wall time.

The report is partly the script's and partly written by hand (the verdict, the time-to-reward section): the script's
parts sit between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` lines, and
:func:`write_report` rewrites only those, so a re-run keeps every hand-written line.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from sage_grpo import sde
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.schema import from_dict, load_yaml
from sage_grpo.config.validation import validation_flow_shift
from sage_grpo.models.loading import load_transformer
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.tracking.run_dir import manifold_error_key, read_metrics, summarize_run, training_rows
from sage_grpo.toy.manifold import fit_manifold, prompt_adherence

KL_YARDSTICK = ("sage_grpo", 0.5)  # the common SDE under which every run's KL to the pretrained model is measured
EVAL_SEEDS = (1000, 1001)


@dataclass(frozen=True)
class Arm:
    """One configuration of an ablation: a name and the post_train.py settings that differ from the base config."""

    ablation: str
    name: str
    overrides: Dict = field(default_factory=dict)


def ablation_arms() -> List[Arm]:
    arms = [Arm("sde", sde_type, {"sde_type": sde_type}) for sde_type in sde.SDE_TYPES]
    kl_modes = {"none": dict(kl_weight=0.0), "fixed": dict(use_moving_KL=False, use_dual_kl=False),
                "moving": dict(use_moving_KL=True, use_dual_kl=False),
                "dual fixed": dict(use_moving_KL=False, use_dual_kl=True),
                "dual moving": dict(use_moving_KL=True, use_dual_kl=True)}
    arms += [Arm("kl", name, overrides) for name, overrides in kl_modes.items()]
    arms += [Arm("equalizer", name, {"use_grad_balancing": on}) for name, on in (("on", True), ("off", False))]
    return arms


def base_config(config_path: str, **overrides) -> TrainConfig:
    values = load_yaml(config_path)
    values.update(overrides)
    return from_dict(TrainConfig, values, source=config_path)


def run_key(cfg: TrainConfig) -> tuple:
    """Arms of different ablations that are the same run (e.g. sage_grpo + dual moving KL + equalizer) share it."""
    return (cfg.rollout.sde_type, cfg.trust_region.kl_weight, cfg.trust_region.use_moving_KL, cfg.trust_region.use_dual_kl, cfg.update.use_grad_balancing, cfg.data.seed)


@torch.no_grad()
def path_kl(policy, pretrained, bundle, prompts: Sequence[str], seeds: Sequence[int], cfg: TrainConfig) -> float:
    """KL(policy path || pretrained path) per latent element under the yardstick SDE, on the policy's own rollouts.

    Both are Gaussian Markov chains with the same noise std n_k, so the path KL is exact:
    sum_k E[ |mu_policy,k - mu_pretrained,k|^2 ] / (2 n_k^2), averaged over latent elements.
    """
    sde_type, eta = KL_YARDSTICK
    sampler = Sampler.build(sde_type, eta, cfg.rollout.grpo_sampling_steps, cfg.rollout.infer_flow_shift_video, cfg.rollout.cfg_scale,
                            micro_batch_size=len(seeds), num_image_tokens=cfg.model.vision_num_semantic_tokens)
    embeds = bundle.encode(list(prompts))
    out = sampler.rollout(policy, bundle.vae, embeds, list(seeds), num_frames=cfg.rollout.sample_n_frames,
                          height=cfg.rollout.rollout_height, width=cfg.rollout.rollout_width, decode=False)
    total = 0.0
    for k in range(sampler.num_steps):
        x, x_next = out.latents[:, k], out.latents[:, k + 1]
        mine = sampler.replay(policy, x, x_next, k, embeds)
        theirs = sampler.replay(pretrained, x, x_next, k, embeds)
        total += float(((mine.mean - theirs.mean) ** 2).mean() / (2 * mine.noise_std ** 2))
    return total


@torch.no_grad()
def evaluate_policy(trainer, pretrained, prompts: Sequence[str]) -> Dict[str, float]:
    """ODE samples of the final policy on the evaluation prompts: reward, manifold error, adherence; and the KL."""
    cfg, bundle = trainer.cfg, trainer.models
    eval_prompts = [p for p in prompts for _ in EVAL_SEEDS]
    seeds = [s for _ in prompts for s in EVAL_SEEDS]
    sampler = trainer.sampler.with_schedule(cfg.validation.validation_num_inference_steps, validation_flow_shift(cfg))
    videos = sampler.rollout(bundle.policy, bundle.vae, bundle.encode(eval_prompts), seeds,
                             num_frames=cfg.rollout.sample_n_frames, height=cfg.rollout.rollout_height, width=cfg.rollout.rollout_width,
                             deterministic=True).videos
    rewards = trainer.reward_fn(videos, eval_prompts)
    fit = fit_manifold(videos)
    return {"eval_reward": float(rewards["avg"].mean()), "eval_manifold_error": float(fit.error.mean()),
            "eval_prompt_adherence": float(prompt_adherence(eval_prompts, fit).nan_to_num(1.0).mean()),
            "kl_to_pretrained": path_kl(bundle.policy, pretrained, bundle, eval_prompts, seeds, cfg)}


def run_one(cfg: TrainConfig, prompts: Sequence[str], window: int, log=print) -> Dict[str, float]:
    """Train one arm in this process and measure it; returns the run's numbers (and its reward curve)."""
    from sage_grpo.trainer import run_training

    start = time.perf_counter()
    trainer = run_training(cfg)
    wall = time.perf_counter() - start
    pretrained = load_transformer(cfg.model.pretrained_model_root, cfg.model.pretrained_transformer_version, torch.float32, "cpu")
    rows = training_rows(read_metrics(Path(cfg.output.output_dir)))
    summary = summarize_run(rows, window)
    key = manifold_error_key(rows)
    result = {"reward_gain": summary["gain"], "manifold_last": summary.get("manifold_last_mean", float("nan")),
              "seconds_per_step": summary["seconds_per_step"], **evaluate_policy(trainer, pretrained, prompts),
              "wall_seconds": wall, "reward_curve": [row["gathered_avg_reward_mean"] for row in rows],
              "manifold_curve": [row[key] for row in rows] if key is not None else []}
    log(f"  {cfg.output.output_dir}: gain {result['reward_gain']:+.3f}, rollout manifold error {result['manifold_last']:.4f}"
        f", KL to pretrained {result['kl_to_pretrained']:.4f}, {wall:.0f} s")
    return result


def mean_spread(values: Sequence[float], digits: int = 4) -> str:
    """'mean ± std' over seeds (population std; '± 0' for one seed)."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {spread:.{digits}f}"


def _markers(name: str) -> Tuple[str, str]:
    return f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"


def generated_block(name: str, text: str) -> str:
    """``text`` between the markers of the generated section ``name``."""
    begin, end = _markers(name)
    body = text.strip("\n")
    return f"{begin}\n{body}\n{end}"


def replace_generated(document: str, sections: Dict[str, str], source: str = "the document") -> str:
    """``document`` with the text of each generated section ``name`` (between its markers) replaced by
    ``sections[name]``, and every line outside the markers kept as it is. A section whose two markers do not each
    appear once, in order, is refused (``ValueError``, naming ``source``): the script would not know what it owns."""
    for name, text in sections.items():
        begin, end = _markers(name)
        if document.count(begin) != 1 or document.count(end) != 1 or document.index(begin) > document.index(end):
            raise ValueError(f"{source} has no generated section {name!r} (one '{begin}' line, then one '{end}' "
                             "line, around the part the script writes); add the two lines, or move the file away to "
                             "have a new one written")
        head, rest = document.split(begin)
        tail = rest.split(end)[1]
        document = head + generated_block(name, text) + tail
    return document


REPORT_SECTIONS = ("header", "results")  # what scripts/toy_study.py writes; the lines around them are by hand
_VERDICT_PLACE = "<!-- verdict: written by hand from the numbers below (see the committed docs/toy_study.md) -->"


def check_report(path: Path) -> None:
    """Refuse (``ValueError``) an existing report at ``path`` without the markers of every generated section."""
    if path.exists():
        replace_generated(path.read_text(), dict.fromkeys(REPORT_SECTIONS, ""), str(path))


def write_report(path: Path, sections: Dict[str, str]) -> None:
    """The generated ``sections`` (``REPORT_SECTIONS``) into the report at ``path``: between their markers in an
    existing report (all else kept), or a new report of the header, a place for the verdict and the results."""
    if path.exists():
        path.write_text(replace_generated(path.read_text(), sections, str(path)))
        return
    blocks = [generated_block("header", sections["header"]), _VERDICT_PLACE,
              generated_block("results", sections["results"])]
    path.write_text("\n\n".join(blocks) + "\n")

"""The outputs of an evaluation, written by rank 0 from every unit's record.

* ``results.json``: the sampler settings (once), then per checkpoint a ``summary`` (per metric: mean, standard error
  of the mean over its prompt x seed samples, n) and ``prompts`` (per prompt: its per-seed scores and their mean),
  plus mean sampling and scoring seconds per (prompt, seed);
* ``results.md``: the summary in the layout of the paper's Table 2 (VQ, MQ, TA, Overall = VQ + MQ + TA, CLIPScore in
  both candidate scalings, Hessel's and Flow-GRPO's, and PickScore on the paper's scale, then the raw PickScore logit
  and any further metric), ``mean ± s.e.``, every column headed with how it is computed (``NaN (k of k failed)``
  where a metric failed on every sample: null in ``results.json``); ``results.json`` holds the same definitions
  (``metric_definitions``);
* ``bars.png``: one bar panel per metric, a bar per checkpoint with its standard error ("NaN" written where a
  checkpoint's metric failed on every sample; a metric that is 0.0 for every checkpoint gets a 0 to 1 axis);
* ``side_by_side/<i>_<prompt>.png``: per prompt (first seed), one row of evenly spaced frames per checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from sage_grpo.evaluate.plan import EvaluationPlan

# Table 2's columns first (key, header), in the paper's order, then the raw scores beside them; then every other
# metric in the order produced.
TABLE2_COLUMNS = (("VQ", "VQ"), ("MQ", "MQ"), ("TA", "TA"), ("Overall", "Overall"),
                  ("clipscore", "CLIPScore (2.5·max(cos,0))"), ("clip_flowgrpo", "CLIP score (logit/30)"),
                  ("pickscore_paper", "PickScore (logit/26)"),
                  ("pickscore", "PickScore logit (raw)"), ("Weighted", "Weighted (--reward_weights)"),
                  ("clip_cosine", "CLIP cos (raw)"), ("pickscore_cosine", "PickScore cos (raw)"))
# Table 2's scale of a raw score, derived per sample (the paper names neither scorer: inferred, docs/evaluation.md):
# PickScore as Flow-GRPO's PickScore scorer reports it, the logit divided by 26.
PAPER_SCALE = {"pickscore_paper": ("pickscore", 1 / 26)}
PAPER_SCALE_KEYS = ("clipscore", "clip_flowgrpo", "pickscore_paper")  # the columns to hold against Table 2
METRIC_DEFINITIONS = {
    "clipscore": "paper scale (one of two candidates for Table 2's CLIPScore): mean over frames of 2.5 * max(cos, 0), "
                 "CLIP ViT-L/14 (Hessel et al.'s CLIPScore)",
    "clip_flowgrpo": "paper scale (one of two candidates for Table 2's CLIPScore): mean over frames of CLIP ViT-L/14's "
                     "logit / 30 = exp(logit_scale) * cos / 30, ~3.33 * cos (Flow-GRPO's CLIP scorer)",
    "pickscore_paper": "paper scale (Table 2's PickScore, inferred): mean over frames of PickScore_v1's logit / 26 "
                       "(Flow-GRPO's PickScore scorer)",
    "pickscore": "raw: mean over frames of PickScore_v1's logit exp(logit_scale) * cos (its model card), ~100 * cos",
    "clip_cosine": "raw: mean over frames of the CLIP ViT-L/14 image-text cosine",
    "pickscore_cosine": "raw: mean over frames of the PickScore_v1 image-text cosine",
}


def with_paper_scale(scores: Dict[str, Optional[float]]) -> Dict[str, Optional[float]]:
    """``scores`` plus the paper-scale values derived from them (``PAPER_SCALE``; a failed score, None, stays None)."""
    derived = {key: None if scores[raw] is None else scores[raw] * factor
               for key, (raw, factor) in PAPER_SCALE.items() if raw in scores}
    return {**scores, **derived}


def mean_and_stderr(values: List[Optional[float]]) -> Dict:
    """Mean and standard error of the mean (sample std / sqrt(n); None for one sample) of the scores that did not
    fail; ``failed``: how many did (None: the scorer failed on that sample). No sample left: mean None."""
    finite = np.asarray([v for v in values if v is not None], dtype=np.float64)
    stderr = float(finite.std(ddof=1) / math.sqrt(len(finite))) if len(finite) > 1 else None
    return {"mean": float(finite.mean()) if len(finite) else None, "stderr": stderr, "n": len(finite),
            "failed": len(values) - len(finite)}


def summarize(plan: EvaluationPlan, records: List[Dict]) -> Dict:
    records = [{**record, "scores": with_paper_scale(record["scores"])} for record in records]
    by_checkpoint: Dict[str, Dict] = {}
    for checkpoint in plan.checkpoints:
        mine = [r for r in records if r["checkpoint"] == checkpoint.label]
        keys = list(dict.fromkeys(key for r in mine for key in r["scores"]))
        prompts = {}
        for index, prompt in enumerate(plan.prompts):
            rows = sorted((r for r in mine if r["prompt_index"] == index), key=lambda r: plan.seeds.index(r["seed"]))
            prompts[prompt] = {"seeds": {str(r["seed"]): r["scores"] for r in rows},
                               "mean": {k: mean_and_stderr([r["scores"].get(k) for r in rows])["mean"] for k in keys}}
        by_checkpoint[checkpoint.label] = {
            "weights": checkpoint.weights,
            "weights_sha256": checkpoint.digest,
            "summary": {k: mean_and_stderr([r["scores"].get(k) for r in mine]) for k in keys},
            "prompts": prompts,
            "seconds_per_video": {"sampling": float(np.mean([r["sampling_s"] for r in mine])),
                                  "scoring": float(np.mean([r["scoring_s"] for r in mine]))},
        }
    metrics = {key for entry in by_checkpoint.values() for key in entry["summary"]}
    return {"settings": plan.settings(), "prompts": plan.prompts, "seeds": plan.seeds, "checkpoints": by_checkpoint,
            "metric_definitions": {key: text for key, text in METRIC_DEFINITIONS.items() if key in metrics}}


def failed_scores(results: Dict) -> List[str]:
    """``label: metric (k of n)`` for every metric that failed on some sample (a warning named each one)."""
    return [f"{label}: {key} ({stat['failed']} of {stat['failed'] + stat['n']})"
            for label, entry in results["checkpoints"].items() for key, stat in entry["summary"].items()
            if stat["failed"]]


def columns_of(results: Dict) -> List[tuple]:
    keys = list(dict.fromkeys(k for c in results["checkpoints"].values() for k in c["summary"]))
    table2 = [(key, header) for key, header in TABLE2_COLUMNS if key in keys]
    return table2 + [(key, key) for key in keys if key not in dict(TABLE2_COLUMNS)]


def _cell(stat: Dict) -> str:
    failed = f" ({stat['failed']} failed)" if stat.get("failed") else ""
    if stat["mean"] is None:  # null in results.json: the scorer failed on every sample
        return f"NaN ({stat.get('failed', 0)} of {stat.get('failed', 0) + stat.get('n', 0)} failed)"
    value = f"{stat['mean']:.4f}" if stat["stderr"] is None else f"{stat['mean']:.4f} ± {stat['stderr']:.4f}"
    return value + failed


def markdown_table(results: Dict) -> str:
    settings = results["settings"]
    columns = columns_of(results)
    lines = [f"Sampler: {settings['sampler']}, {settings['num_inference_steps']} steps, "
             f"{settings['height']}x{settings['width']}x{settings['video_length']} frames, CFG "
             f"{settings['guidance_scale']}, shift {settings['flow_shift']}, {settings['dtype']}; "
             f"{len(results['prompts'])} prompts x {len(results['seeds'])} seeds {results['seeds']}; "
             "mean ± standard error over the (prompt, seed) samples."
             + (" Overall = VQ + MQ + TA." if any(key == "Overall" for key, _ in columns) else "")
             + (" CLIPScore (2.5·max(cos,0)) and CLIP score (logit/30) are the two candidate scalings of Table 2's "
                "CLIPScore, PickScore (logit/26) is on Table 2's scale (the paper names no scorer: inferred, see "
                "docs/evaluation.md); hold those against Table 2, not the raw columns."
                if any(key in PAPER_SCALE_KEYS for key, _ in columns) else ""), "",
             "| Model | " + " | ".join(header for _, header in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for label, entry in results["checkpoints"].items():
        cells = [_cell(entry["summary"][key]) if key in entry["summary"] else "" for key, _ in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(results: Dict, path: Path) -> Path:
    from sage_grpo.tracking.plots import BarPanel, plot_bars

    labels = list(results["checkpoints"])
    panels = []
    for key, header in columns_of(results):
        stats = [results["checkpoints"][label]["summary"].get(key) for label in labels]
        means = [s["mean"] if s and s["mean"] is not None else math.nan for s in stats]
        panels.append(BarPanel(header, labels, means,
                               [s["stderr"] if s and s["stderr"] is not None else 0.0 for s in stats]))
    return plot_bars(panels, path, title="mean ± standard error per checkpoint")


def side_by_side(plan: EvaluationPlan, strips: Dict, folder: Path) -> List[Path]:
    """One PNG per prompt: a labelled row of frames per checkpoint (``strips[(label, prompt index)]``)."""
    from PIL import Image, ImageDraw

    from sage_grpo.video_io import sanitize_name

    label_width, paths = 220, []
    for index, prompt in enumerate(plan.prompts):
        rows = [strips[(c.label, index)] for c in plan.checkpoints]
        height, width = rows[0].shape[0], max(row.shape[1] for row in rows)
        canvas = Image.new("RGB", (label_width + width, 20 + len(rows) * (height + 4)), "white")
        draw = ImageDraw.Draw(canvas)
        draw.text((6, 4), f"{prompt[:150]}  (seed {plan.seeds[0]})", fill="black")
        for number, (checkpoint, row) in enumerate(zip(plan.checkpoints, rows)):
            y = 20 + number * (height + 4)
            label = checkpoint.label if len(checkpoint.label) <= 34 else "..." + checkpoint.label[-31:]
            draw.text((6, y + height // 2 - 6), label, fill="black")
            canvas.paste(Image.fromarray(row), (label_width, y))
        path = folder / f"{index:03d}_{sanitize_name(prompt, 40) or 'prompt'}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        canvas.save(path)
        paths.append(path)
    return paths


def write_reports(plan: EvaluationPlan, records: List[Dict], strips: Dict) -> Dict:
    from sage_grpo.safe_io import atomic_write

    results = summarize(plan, records)
    plan.output.mkdir(parents=True, exist_ok=True)
    atomic_write(plan.output / "results.json", json.dumps(results, indent=2, allow_nan=False))  # strict JSON
    atomic_write(plan.output / "results.md", markdown_table(results))
    bar_chart(results, plan.output / "bars.png")
    side_by_side(plan, strips, plan.output / "side_by_side")
    return results

"""Sampling and scoring every (checkpoint, prompt, seed), with a cache that makes an interrupted evaluation resume.

Each finished unit is written at once to ``<output>/cache/<checkpoint key>/<prompt hash>_seed<seed>.json`` (its
scores, timings and the settings' fingerprint) plus a ``.png`` strip of evenly spaced frames for the side-by-side
picture, each by write-then-rename, so a unit is either complete or absent. A rerun with the same settings skips the
units it finds; a cache of other settings is refused by the plan, never mixed in nor deleted.

Under torchrun the prompts are split over the ranks (prompt ``i`` goes to rank ``i mod world``, with all its seeds
and checkpoints); each rank loads every checkpoint once, samples and scores its share and rank 0 gathers the records
(over the process group, so no shared file system is needed for the reports; the caches are per rank's units).
Videos are seeded per unit (generate.py's CPU generator), so the split does not change any score.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from sage_grpo.evaluate.plan import Checkpoint, EvaluationPlan, write_cache_settings


def unit_path(plan: EvaluationPlan, checkpoint: Checkpoint, prompt: str, seed: int) -> Path:
    digest = hashlib.sha1(prompt.encode()).hexdigest()[:12]
    return plan.output / "cache" / checkpoint.key / f"{digest}_seed{seed}.json"


def _write_atomically(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    write(partial)
    os.replace(partial, path)


def frame_strip(video: torch.Tensor, num_frames: int, height: int) -> np.ndarray:
    """(height, num_frames * width, 3) uint8: evenly spaced frames of ``video (3, F, H, W)`` side by side."""
    frames = video.shape[1]
    picks = sorted({round(i * (frames - 1) / max(num_frames - 1, 1)) for i in range(num_frames)})
    chosen = video[:, picks].float().clamp(0, 1).permute(1, 0, 2, 3)  # (K, 3, H, W)
    width = max(1, round(video.shape[3] * height / video.shape[2]))
    resized = torch.nn.functional.interpolate(chosen, size=(height, width), mode="bilinear", antialias=True,
                                              align_corners=False)
    strip = torch.cat(list(resized), dim=2)  # (3, height, K * width)
    return (strip.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def read_unit(path: Path, fingerprint: str) -> Optional[Dict]:
    """The cached record at ``path`` if it is complete and of these settings, else None."""
    if not path.is_file() or not path.with_suffix(".png").is_file():
        return None
    record = json.loads(path.read_text())
    return record if record.get("fingerprint") == fingerprint else None


def write_unit(path: Path, record: Dict, strip: np.ndarray) -> None:
    from PIL import Image

    _write_atomically(path.with_suffix(".png"), lambda p: Image.fromarray(strip).save(p, format="PNG"))
    _write_atomically(path, lambda p: p.write_text(json.dumps(record, indent=1)))


def my_prompt_indices(num_prompts: int, rank: int, world_size: int) -> List[int]:
    return list(range(rank, num_prompts, world_size))


def run_units(plan: EvaluationPlan, scorers, config, rank: int = 0, world_size: int = 1,
              stop_after: Optional[int] = None) -> List[Dict]:
    """Sample and score this rank's units not in the cache; return all of this rank's records.

    ``stop_after``: stop (as an interruption would) after sampling that many units; for the resume tests."""
    from tqdm.auto import tqdm

    from sage_grpo.pipeline.generation import GenerationItem, VideoGenerator

    if rank == 0:
        write_cache_settings(plan)
    fingerprint = plan.fingerprint()
    mine = my_prompt_indices(len(plan.prompts), rank, world_size)
    units = [(c, i, s) for c in plan.checkpoints for i in mine for s in plan.seeds]
    pending = [u for u in units if read_unit(unit_path(plan, u[0], plan.prompts[u[1]], u[2]), fingerprint) is None]
    bar = tqdm(total=len(units), initial=len(units) - len(pending), desc=f"evaluate (rank {rank})", unit="video",
               disable=None)
    sampled = 0
    for checkpoint in plan.checkpoints:
        todo = [(i, s) for c, i, s in pending if c == checkpoint]
        if not todo:
            continue
        generator = VideoGenerator(plan.generate_config(checkpoint), plan.sampling_for(checkpoint))
        for index, seed in todo:
            if stop_after is not None and sampled >= stop_after:
                bar.close()
                return []
            prompt = plan.prompts[index]
            start = time.perf_counter()
            video = generator.render(GenerationItem(prompt, seed))  # (3, F, H, W) in [0, 1]
            sampled_at = time.perf_counter()
            scores = scorers(video, prompt)
            record = {"checkpoint": checkpoint.label, "prompt": prompt, "prompt_index": index, "seed": seed,
                      "scores": scores, "sampling_s": sampled_at - start,
                      "scoring_s": time.perf_counter() - sampled_at, "rank": rank, "fingerprint": fingerprint}
            write_unit(unit_path(plan, checkpoint, prompt, seed), record,
                       frame_strip(video, config.picture_frames, config.picture_height))
            sampled += 1
            bar.update(1)
        del generator
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    bar.close()
    return [read_unit(unit_path(plan, c, plan.prompts[i], s), fingerprint) for c, i, s in units]


def read_strip(plan: EvaluationPlan, checkpoint: Checkpoint, prompt: str, seed: int) -> np.ndarray:
    from PIL import Image

    with Image.open(unit_path(plan, checkpoint, prompt, seed).with_suffix(".png")) as image:
        return np.asarray(image.convert("RGB"))


def gather_records(records: List[Dict], strips: Dict, world_size: int):
    """Rank 0 gets every rank's records and picture strips (None on the other ranks); one process: as given."""
    if world_size == 1:
        return records, strips
    import torch.distributed as dist

    everything = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object((records, strips), everything, dst=0)
    if dist.get_rank() != 0:
        return None, None
    all_records, all_strips = [], {}
    for rank_records, rank_strips in everything:
        all_records += rank_records
        all_strips.update(rank_strips)
    return all_records, all_strips

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
import io
import json
import math
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from sage_grpo.evaluate.plan import Checkpoint, EvaluationPlan, write_cache_settings
from sage_grpo.safe_io import CheckpointError, read_json_object

MAX_UNIT_RECORD_BYTES = 1 << 20  # one unit's scores and timings: a few hundred bytes


def unit_path(plan: EvaluationPlan, checkpoint: Checkpoint, prompt: str, seed: int) -> Path:
    digest = hashlib.sha1(prompt.encode()).hexdigest()[:12]
    return plan.output / "cache" / checkpoint.key / f"{digest}_seed{seed}.json"


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


def _is_number(value, *, allow_none: bool = False) -> bool:
    if value is None:
        return allow_none
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def expected_unit(plan: EvaluationPlan, checkpoint: Checkpoint, index: int, seed: int) -> Dict:
    """What a cached record of this unit must say of itself (a record that says otherwise is foreign or stale): what
    determines its numbers (the prompt's text, the seed, the settings and the weights), not the prompt's row."""
    return {"checkpoint": checkpoint.label, "prompt": plan.prompts[index], "seed": seed,
            "fingerprint": plan.fingerprint(), "weights": checkpoint.digest}


def read_unit(path: Path, expected: Dict) -> Tuple[Optional[Dict], Optional[str]]:
    """(the cached record at ``path``, None) when it is complete, well-formed and of this unit (``expected``: its
    checkpoint, prompt, seed, settings fingerprint and weights digest); else (None, why it is sampled again), with
    why None when there is simply no record yet. Nothing in a cache file is trusted: it is read as JSON, checked
    field by field, and its picture strip must decode."""
    from PIL import Image

    if not path.is_file():
        return None, None
    try:
        record = read_json_object(path, "the unit record", "it is sampled again", error=ValueError,
                                  max_bytes=MAX_UNIT_RECORD_BYTES)
        with Image.open(path.with_suffix(".png")) as image:
            image.verify()
    except Exception as err:  # noqa: BLE001 - a garbled file fails in many ways (JSON, PNG): each means re-sample
        return None, f"unreadable ({type(err).__name__})"
    if not isinstance(record, dict) or not isinstance(record.get("scores"), dict):
        return None, "not a unit record"
    if any(record.get(key) != value for key, value in expected.items()):
        differs = next(key for key, value in expected.items() if record.get(key) != value)
        return None, "weights changed since it was sampled" if differs == "weights" else f"another {differs}"
    if not all(isinstance(k, str) and _is_number(v, allow_none=True) for k, v in record["scores"].items()) or \
            not all(_is_number(record.get(key)) and record[key] >= 0 for key in ("sampling_s", "scoring_s")):
        return None, "malformed scores or timings"
    return record, None


def write_unit(path: Path, record: Dict, strip: np.ndarray) -> None:
    """The picture strip, then the record, each written by write-then-rename under a temporary name of this process
    (:func:`~sage_grpo.safe_io.atomic_write`): two evaluations writing into one folder never share one."""
    from PIL import Image

    from sage_grpo.safe_io import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    picture = io.BytesIO()
    Image.fromarray(strip).save(picture, format="PNG")
    atomic_write(path.with_suffix(".png"), picture.getvalue())
    atomic_write(path, json.dumps(record, indent=1, allow_nan=False))


def finite_or_none(scores: Dict[str, float]) -> Dict[str, Optional[float]]:
    """A unit's scores as JSON data: a failed (non-finite) score is null, counted as failed in the report."""
    return {key: value if math.isfinite(value) else None for key, value in scores.items()}


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
    mine = my_prompt_indices(len(plan.prompts), rank, world_size)
    units = [(c, i, s) for c in plan.checkpoints for i in mine for s in plan.seeds]
    pending = pending_units(plan, units)
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
            record = {**expected_unit(plan, checkpoint, index, seed), "scores": finite_or_none(scores),
                      "sampling_s": sampled_at - start, "scoring_s": time.perf_counter() - sampled_at, "rank": rank}
            write_unit(unit_path(plan, checkpoint, prompt, seed), record,
                       frame_strip(video, config.picture_frames, config.picture_height))
            sampled += 1
            bar.update(1)
        del generator
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    bar.close()
    records = [read_unit(unit_path(plan, c, plan.prompts[i], s), expected_unit(plan, c, i, s)) for c, i, s in units]
    lost = [str(unit_path(plan, c, plan.prompts[i], s)) for (c, i, s), (record, _) in zip(units, records)
            if record is None]
    if lost:  # another writer replaced or removed units while this one ran
        raise CheckpointError(f"{len(lost)} cached unit(s) changed while this evaluation ran, e.g. {lost[0]}: "
                              "was another evaluation writing into the same --output? Rerun to sample them again")
    return [{**record, "prompt_index": index} for (_, index, _), (record, _) in zip(units, records)]


def pending_units(plan: EvaluationPlan, units: List[Tuple]) -> List[Tuple]:
    """The units not in the cache; a cached record that is unreadable, foreign or of other weights is sampled again,
    and each checkpoint with such records gets one note line."""
    pending, stale = [], {}
    for checkpoint, index, seed in units:
        record, why = read_unit(unit_path(plan, checkpoint, plan.prompts[index], seed),
                                expected_unit(plan, checkpoint, index, seed))
        if record is None:
            pending.append((checkpoint, index, seed))
        if why is not None:
            stale.setdefault((checkpoint, why), []).append(index)
    for (checkpoint, why), indices in stale.items():
        print(f"note: {len(indices)} cached unit(s) of {checkpoint.label} are sampled again: {why} "
              f"({plan.output / 'cache' / checkpoint.key})")
    return pending


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

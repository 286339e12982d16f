"""Evaluate checkpoints the way the paper's Table 2 does: sample every prompt x seed with each, score, tabulate.

    python -m sage_grpo.evaluate --checkpoints base outputs/run/checkpoint-100 outputs/export --prompts eval.csv \
        --seeds 0 1 --metrics videoalign,clipscore,pickscore --output eval/
    torchrun --nproc_per_node 8 -m sage_grpo.evaluate ...      (prompts split over the ranks)

(also ``sage-grpo-evaluate`` and ``scripts/evaluate.py``). Options: ``--help`` (sage_grpo/evaluate/config.py).
Outputs (sage_grpo/evaluate/report.py): results.json, results.md (Table 2's layout), bars.png, side_by_side/*.png;
cache/ holds each finished (checkpoint, prompt, seed), so rerunning the same command resumes.
"""

import sys
from typing import Dict, Optional

import torch

from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.config.schema import parse_cli
from sage_grpo.evaluate.config import EvaluateConfig
from sage_grpo.evaluate.plan import EvaluationPlan, plan_evaluation
from sage_grpo.models.layout import MissingCheckpointError
from sage_grpo.safe_io import CheckpointError


def _default_device() -> Optional[str]:
    """This rank's GPU under torchrun (LOCAL_RANK), as the process group will use; None lets generate.py choose."""
    if torch.cuda.is_available():
        return f"cuda:{read_launch_env().local_rank}"
    return None


def run_evaluation(config: EvaluateConfig, plan: EvaluationPlan, rank: int = 0, world_size: int = 1,
                   stop_after: Optional[int] = None) -> Optional[Dict]:
    """Sample, score and (rank 0) write the reports; returns the results on rank 0, else None. ``stop_after``
    interrupts after that many sampled videos (tests of the resume)."""
    from sage_grpo.dtypes import DTYPES
    from sage_grpo.evaluate.report import failed_scores, markdown_table, write_reports
    from sage_grpo.evaluate.runner import gather_records, my_prompt_indices, read_strip, run_units
    from sage_grpo.evaluate.scoring import Scorers

    if rank == 0:
        for note in plan.sampling.notes + plan.sampling.warnings:
            print(f"note: {note}")
    scorers = Scorers(plan.metrics, config.model_path, plan.sampling.device, DTYPES[config.dtype])
    records = run_units(plan, scorers, config, rank, world_size, stop_after)
    if stop_after is not None and not records:
        return None
    strips = {(c.label, i): read_strip(plan, c, plan.prompts[i], plan.seeds[0])
              for c in plan.checkpoints for i in my_prompt_indices(len(plan.prompts), rank, world_size)}
    records, strips = gather_records(records, strips, world_size)
    if rank != 0:
        return None
    results = write_reports(plan, records, strips)
    print(markdown_table(results))
    failed = failed_scores(results)
    if failed:  # counted, not fatal: the warnings above name each sample and its cause
        print(f"warning: scores failed (null in results.json, left out of the means): {'; '.join(failed)}")
    print(f"wrote {plan.output}/results.json, results.md, bars.png and side_by_side/")
    return results


def main(argv=None) -> int:
    config = parse_cli(EvaluateConfig, argv, description=__doc__.splitlines()[0])
    from sage_grpo.distributed.liveness import PeerLost
    from sage_grpo.distributed.parallel_dims import destroy_distributed, init_distributed
    from sage_grpo.plan.fit import check_generate_weights_fit

    try:  # torchrun's variables are checked first: the device choice reads LOCAL_RANK
        world_size = read_launch_env().world_size
        plan = plan_evaluation(config, device=_default_device())  # every bad input fails here, before any model
        check_generate_weights_fit(config.model_path, plan.sampling.transformer_version, config.dtype,
                                   plan.sampling.device.type)  # the video models' weights against the RAM
        rank = init_distributed().rank if world_size > 1 else 0  # the address checked, the peers awaited
    except (ValueError, FileNotFoundError, PeerLost) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        run_evaluation(config, plan, rank, world_size)
    except (CheckpointError, MissingCheckpointError) as err:  # an unreadable, unsafe or missing weight file
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if world_size > 1:
            destroy_distributed()
    return 0

"""Golden metrics: every logged number of a short tiny CPU run (fixed seeds), pinned in ``tests/golden/tiny_run.json``.

A change that moves any of them fails here and must update the file on purpose, in the same commit, saying why::

    SAGE_GRPO_UPDATE_GOLDEN=1 bash scripts/test.sh -k golden

The file holds recordings per CPU kind (torch's CPU capability and version) and processor: on a kind it has
recordings for, the numbers must equal one of them exactly (two processors of one instruction set can still sum in
another order: an AMD EPYC and an Intel Xeon with AVX512 differ in the 8th digit, so each has its own recording);
elsewhere they are compared with the first recording to 1e-4 relative (1e-5 absolute: the PPO loss is a sum of
z-scored advantages that cancels to ~1e-5). ``SAGE_GRPO_UPDATE_GOLDEN=1`` rewrites the file with this machine's
recording alone (the code changed the numbers, so the other recordings no longer describe it);
``SAGE_GRPO_UPDATE_GOLDEN=add`` adds or replaces this machine's recording of the same code and keeps the others
(checked: the new rows must be close to the existing ones).
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from model_fixtures import tiny_args

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics
from sage_grpo.trainer import GRPOTrainer


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny_run.json"
# dual moving KL with an anchor refresh at update 2, the equalizer and Muon: every term of the loss is exercised
FLAGS = ("--max_steps", "3", "--update_ref_model_step", "2", "--use_muon", "true", "--seed", "7")


def processor() -> str:
    """The processor's model name (Linux's /proc/cpuinfo; elsewhere what ``platform`` says)."""
    from sage_grpo.studies.pretrain import cpu_name

    return cpu_name()


def machine() -> dict:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "cpu": processor()}


def same_kind(written_on: dict) -> bool:
    here = machine()
    return all(written_on.get(key) == here[key] for key in ("cpu_capability", "torch"))


def differences(rows: list, expected_rows: list, exact: bool) -> list:
    """``step N key: expected -> got`` for each number that moved (exactly, or beyond the cross-machine tolerance)."""
    moved = []
    for row, expected in zip(rows, expected_rows):
        for key, value in expected.items():
            same = (row[key] == value or (math.isnan(value) and math.isnan(row[key])) if exact
                    else math.isclose(row[key], value, rel_tol=1e-4, abs_tol=1e-5))
            if not same:
                moved.append(f"step {row['step']} {key}: {value!r} -> {row[key]!r}")
    return moved


def write_golden(rows: list, mode: str) -> None:
    recordings = [{"written_on": machine(), "rows": rows}]
    if mode == "add" and GOLDEN.exists():
        kept = [r for r in json.loads(GOLDEN.read_text())["recordings"] if r["written_on"] != machine()]
        assert not kept or not differences(rows, kept[0]["rows"], exact=False), "add is for the same code only"
        recordings = kept + recordings
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"flags": " ".join(FLAGS) + " (plus tests/model_fixtures.py tiny_args)",
                                  "recordings": recordings}, indent=1) + "\n")


def test_metrics_match_the_golden_file(tiny_root, tmp_path):
    trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", *FLAGS)))
    trainer.train()
    rows = [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in read_metrics(trainer.run_dir)]
    mode = os.environ.get("SAGE_GRPO_UPDATE_GOLDEN")
    if mode in ("1", "add"):
        write_golden(rows, mode)
        pytest.skip(f"wrote {GOLDEN}")
    recordings = json.loads(GOLDEN.read_text())["recordings"]
    mine = [r for r in recordings if same_kind(r["written_on"])]
    if any(not differences(rows, r["rows"], exact=True) for r in mine if len(r["rows"]) == len(rows)):
        return  # equal to this kind's recording of one processor
    golden = next((r for r in mine if r["written_on"].get("cpu") == processor()), (mine or recordings)[0])
    assert [sorted(row) for row in rows] == [sorted(row) for row in golden["rows"]], "the logged metrics changed"
    moved = differences(rows, golden["rows"], exact=bool(mine))
    assert not moved, ("numbers moved (update tests/golden/tiny_run.json on purpose if intended):\n  "
                       + "\n  ".join(moved))

"""Golden metrics: every logged number of a short tiny CPU run (fixed seeds), pinned in ``tests/golden/tiny_run.json``.

A change that moves any of them fails here and must update the file on purpose, in the same commit, saying why::

    SAGE_GRPO_UPDATE_GOLDEN=1 bash scripts/test.sh -k golden

On the CPU kind the file was written on (torch's CPU capability and version are recorded) the numbers must match
exactly; elsewhere (another instruction set sums in another order) to 1e-4 relative.
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from model_fixtures import tiny_args

from sage_grpo.config import TrainConfig, parse_cli
from sage_grpo.tracking.run_dir import PHASE_TIMES, read_metrics
from sage_grpo.trainer import GRPOTrainer


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny_run.json"
# dual moving KL with an anchor refresh at update 2, the equalizer and Muon: every term of the loss is exercised
FLAGS = ("--max_steps", "3", "--update_ref_model_step", "2", "--use_muon", "true", "--seed", "7")


def machine() -> dict:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def test_metrics_match_the_golden_file(tiny_root, tmp_path):
    trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", *FLAGS)))
    trainer.train()
    rows = [{k: v for k, v in row.items() if k not in PHASE_TIMES} for row in read_metrics(trainer.run_dir)]
    if os.environ.get("SAGE_GRPO_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"flags": " ".join(FLAGS) + " (plus tests/model_fixtures.py tiny_args)",
                                      "written_on": machine(), "rows": rows}, indent=1) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    exact = golden["written_on"] == machine()
    assert [sorted(row) for row in rows] == [sorted(row) for row in golden["rows"]], "the logged metrics changed"
    moved = []
    for row, expected in zip(rows, golden["rows"]):
        for key, value in expected.items():
            same = (row[key] == value or (math.isnan(value) and math.isnan(row[key])) if exact
                    else math.isclose(row[key], value, rel_tol=1e-4, abs_tol=1e-9))
            if not same:
                moved.append(f"step {row['step']} {key}: {value!r} -> {row[key]!r}")
    assert not moved, ("numbers moved (update tests/golden/tiny_run.json on purpose if intended):\n  "
                       + "\n  ".join(moved))

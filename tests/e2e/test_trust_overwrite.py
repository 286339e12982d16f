"""Through the real command: a start with ``--overwrite_output_dir true`` and a size the model cannot
take ends in one line, before the earlier run is touched. The one whole-run case of the start's input checks (the
rest are in-process, tests/unit/test_trust_inputs.py): it needs an earlier run as the trainer leaves it and the
exit of ``post_train.py`` itself.
"""

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest
from model_fixtures import tiny_args
from procs import run_group

from sage_grpo.faults import FAULT_ENV

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _post_train(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop(FAULT_ENV, None)
    return run_group([sys.executable, "post_train.py", *args], cwd=REPO_ROOT, env=env, timeout=300)


@pytest.mark.parametrize("bad,start", [(["--rollout_height", "20"], "error: rollout size (--rollout_height/"),
                                       (["--sample_n_frames", "6"], "error: --sample_n_frames 6: num_frames")])
def test_overwrite_with_a_size_the_model_cannot_take_keeps_the_earlier_run(tiny_root, tmp_path_factory, bad,
                                                                          start):
    run = tmp_path_factory.getbasetemp() / "trust_runs_earlier"
    if not (run / "checkpoint-2").is_dir():  # one 2-step run shared by both cases (neither may change it)
        done = _post_train(*tiny_args(tiny_root, run, "--max_steps", "2", "--save_interval", "1"))
        assert done.returncode == 0, done.stderr[-3000:]
    before = _snapshot(run)
    assert {"checkpoint-1/training_state.pt", "checkpoint-2/training_state.pt", "metrics.jsonl",
            "run_config.yaml", "train.log"} <= set(before)

    began = time.perf_counter()
    refused = _post_train(*tiny_args(tiny_root, run, "--max_steps", "2", "--overwrite_output_dir", "true", *bad))
    elapsed = time.perf_counter() - began
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), refused.stderr[-3000:]
    assert _snapshot(run) == before  # every file of the earlier run, byte for byte
    print(f"refused in {elapsed:.1f} s (process start to exit)")

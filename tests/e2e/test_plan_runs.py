"""post_train.py refuses a launch the memory plan says does not fit, before any model loads."""
import re
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_post_train_refuses_before_loading(tiny_root, tmp_path):
    """post_train.py on a (declared) GPU of 1 GB: exit 2 with the one-line reason and the table, nothing written.
    No GPU is needed: the check runs before any model or device is touched."""
    from model_fixtures import tiny_args
    from procs import run_group

    out_dir = tmp_path / "run"
    result = run_group([sys.executable, "post_train.py", *tiny_args(tiny_root, out_dir), "--device", "cuda",
                        "--gpu_memory_gb", "1"], cwd=REPO_ROOT, timeout=120)

    assert result.returncode == 2, result.stderr[-2000:]
    assert re.search(r"error: \[memory-plan\] the launch needs \d+\.\d GB per GPU", result.stderr)
    assert "| component" in result.stderr and "runtime overhead" in result.stderr
    assert not out_dir.exists()

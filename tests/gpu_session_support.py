"""Helpers shared by unit/test_gpu_session.py and e2e/test_gpu_session_runs.py: the runner loaded as a module (it is a
script, and imports only the standard library) and summary.tsv read back."""
import importlib.util
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[1]
RUNNER = REPO_ROOT / "scripts" / "gpu_session.py"


def load_runner():
    spec = importlib.util.spec_from_file_location("gpu_session", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(out_dir: Path) -> list:
    """(part, label, status) of each line of summary.tsv."""
    return [tuple(line.split("\t")[:3]) for line in (out_dir / "summary.tsv").read_text().splitlines()]

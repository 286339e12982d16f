"""Helpers shared by unit/test_generate.py and e2e/test_generate_runs.py."""
from pathlib import Path


def write_csv(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)

"""Helpers shared by unit/test_trust.py and e2e/test_trust_runs.py."""
from pathlib import Path


def write_module(root: Path, name: str, source: str) -> None:
    path = root.joinpath(*name.split("."))
    if "." in name:
        for parent in list(path.parents)[:name.count(".")]:
            parent.mkdir(parents=True, exist_ok=True)
            (parent / "__init__.py").touch()
    path.with_suffix(".py").write_text(source)

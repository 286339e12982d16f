"""Helpers shared by the trust tests (unit/test_trust*.py and e2e/test_trust_runs.py)."""
from pathlib import Path


def write_module(root: Path, name: str, source: str) -> None:
    path = root.joinpath(*name.split("."))
    if "." in name:
        for parent in list(path.parents)[:name.count(".")]:
            parent.mkdir(parents=True, exist_ok=True)
            (parent / "__init__.py").touch()
    path.with_suffix(".py").write_text(source)


def alias_bomb(path: Path, levels: int, key: str = "reward_kwargs") -> Path:
    """A billion-laughs YAML: under ``key``, each level is a list of nine references to the one before (9**levels
    strings if anything expanded it)."""
    lines = [f"{key}:", "  l0: &l0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    path.write_text("\n".join(lines) + "\n")
    return path

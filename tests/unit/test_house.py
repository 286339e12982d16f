"""The house's sizes and its one configuration: no function over 60 lines, the training configuration imported by
at most 5 modules (the others receive its sections), and no list of option names kept by hand anywhere in the package
(what an option is lives in its declaration: sage_grpo/config/sections.py). The folders' tree of layers and the file
sizes are tests/unit/test_architecture.py's.

    python tests/unit/test_house.py     # prints the figures docs/layout.md records

Read with ``ast`` from the package's source, so nothing is imported but the configuration (for its option names).
"""
import ast
import sys
from pathlib import Path
from typing import Dict, List, Tuple

PACKAGE = Path(__file__).resolve().parents[2] / "sage_grpo"
MAX_FUNCTION_LINES = 60
MAX_CONFIG_IMPORTERS = 5
CONFIG_CLASS = "TrainConfig"
MIN_LISTED_NAMES = 8  # a literal of this many option names (or more) is a list someone keeps by hand


def _trees(package: Path) -> Dict[str, ast.AST]:
    return {p.relative_to(package).as_posix(): ast.parse(p.read_text(), str(p)) for p in sorted(package.rglob("*.py"))}


def function_lengths(package: Path = PACKAGE) -> List[Tuple[int, str]]:
    """``(lines, "file:function")`` of every function and method, longest first."""
    found = [(node.end_lineno - node.lineno + 1, f"{name}:{node.name}")
             for name, tree in _trees(package).items() for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted(found, reverse=True)


def file_lengths(package: Path = PACKAGE) -> List[Tuple[int, str]]:
    return sorted(((len(p.read_text().splitlines()), p.relative_to(package).as_posix())
                   for p in package.rglob("*.py")), reverse=True)


def importers_of(class_name: str, package: Path = PACKAGE) -> List[str]:
    """The modules naming ``class_name`` in an import (``from X import Name``, any place in the module, under
    ``TYPE_CHECKING`` too) or as an attribute (``X.Name``); the module that defines it is not counted."""
    found = []
    for name, tree in _trees(package).items():
        defines = any(isinstance(node, ast.ClassDef) and node.name == class_name for node in ast.walk(tree))
        named = any((isinstance(node, ast.ImportFrom) and any(alias.name == class_name for alias in node.names))
                    or (isinstance(node, ast.Attribute) and node.attr == class_name) for node in ast.walk(tree))
        if named and not defines:
            found.append(name)
    return found


def listed_option_names(option_names: set, package: Path = PACKAGE) -> List[str]:
    """``file:line (N names)`` of every list, tuple or set literal of at least :data:`MIN_LISTED_NAMES` strings that
    are all option names."""
    found = []
    for name, tree in _trees(package).items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) >= MIN_LISTED_NAMES:
                texts = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(texts) == len(node.elts) and set(texts) <= option_names:
                    found.append(f"{name}:{node.lineno} ({len(texts)} names)")
    return found


def option_names() -> set:
    sys.path.insert(0, str(PACKAGE.parent))
    from sage_grpo.config.generate import GenerateConfig
    from sage_grpo.config.reward_server import RewardServerConfig
    from sage_grpo.config.sections import fields_by_name
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.evaluate.config import EvaluateConfig

    return {name for cls in (TrainConfig, GenerateConfig, EvaluateConfig, RewardServerConfig)
            for name in fields_by_name(cls)}


def test_no_function_over_60_lines():
    assert [entry for entry in function_lengths() if entry[0] > MAX_FUNCTION_LINES] == []


def test_the_training_configuration_is_imported_by_at_most_five_modules():
    """The command line, the start-up resolution, the launchers' flag filter, the planner's command and the toy
    study parse or build it; every other module receives the sections it reads."""
    assert len(importers_of(CONFIG_CLASS)) <= MAX_CONFIG_IMPORTERS, importers_of(CONFIG_CLASS)


def test_no_list_of_option_names_is_kept_by_hand():
    assert listed_option_names(option_names()) == []


def test_the_checks_catch_what_they_should(tmp_path):
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "conf.py").write_text("class TrainConfig:\n    pass\n")
    (package / "a.py").write_text("from fakepkg.conf import TrainConfig\nNAMES = ('a', 'b', 'c', 'd', 'e', 'f', 'g', "
                                  "'h')\n\n\ndef long():\n" + "    x = 1\n" * 61)
    (package / "b.py").write_text("import fakepkg.conf\nT = fakepkg.conf.TrainConfig\n")
    assert importers_of("TrainConfig", package) == ["a.py", "b.py"]
    assert listed_option_names(set("abcdefgh"), package) == ["a.py:2 (8 names)"]
    assert function_lengths(package)[0] == (62, "a.py:long")


if __name__ == "__main__":
    files, functions = file_lengths(), function_lengths()
    print(f"files: {len(files)}, the largest {files[0][0]} lines ({files[0][1]}); over 400 lines: "
          f"{sum(1 for n, _ in files if n > 400)}")
    print(f"functions: {len(functions)}, the longest {functions[0][0]} lines ({functions[0][1]}); over "
          f"{MAX_FUNCTION_LINES} lines: {sum(1 for n, _ in functions if n > MAX_FUNCTION_LINES)}")
    print(f"{CONFIG_CLASS} imported by {len(importers_of(CONFIG_CLASS))} modules: {', '.join(importers_of(CONFIG_CLASS))}")
    print(f"lists of option names kept by hand: {len(listed_option_names(option_names()))}")

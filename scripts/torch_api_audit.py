"""Does another torch version have every torch name this project uses? A static check against its Python sources.

For a torch that cannot be installed here (the GPU image's torch 2.11 is a CUDA build of several GB; the floor
``torch>=2.9``), unpack only its ``.py`` / ``.pyi`` files and compare::

    pip download torch==2.11.0 --no-deps --only-binary=:all: --python-version 3.12 -d /tmp/w
    unzip -q /tmp/w/torch-2.11.0-*.whl 'torch/*.py' 'torch/*.pyi' -d /tmp/torch211
    python scripts/torch_api_audit.py /tmp/torch211

It collects every ``torch...`` name the project's Python files use (through ``import torch``, ``import torch.x as y``
and ``from torch.x import y``, attribute chains and calls with their keywords) and, with the installed torch as the
reference, reports what the other version lacks:

1. a name whose module file (or ``torch/_C/*.pyi``) mentions it in the installed torch but not in the other;
2. a function defined in Python (or a class's ``__init__``), looked up in the other version's copy of the file that
   defines it here: absent there, or lacking a keyword the project passes (``**kwargs`` accepts any).

Only differences are reported, so a name that this textual lookup cannot find in either version (a re-export
through ``import *``) is not a finding: the check is a screen, not a proof; running the tests under that torch is.
Exit status 1 when something is reported.
"""

import argparse
import ast
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("sage_grpo", "scripts", "tests")

Uses = Dict[str, Set[Tuple[str, Tuple[str, ...]]]]  # full name -> {(file, keywords of one call)}


def project_files(root: Path) -> Iterator[Path]:
    yield from sorted(root.glob("*.py"))
    for name in SOURCE_DIRS:
        yield from sorted((root / name).rglob("*.py"))


def _chain(node: ast.AST) -> Optional[List[str]]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def collect_uses(files) -> Uses:
    """Every torch name used in ``files``, with the keywords of each call."""
    uses: Uses = {}
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> full torch name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "torch":
                        aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                        uses.setdefault(alias.name, set()).add((str(path), ()))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    uses.setdefault(f"{node.module}.{alias.name}", set()).add((str(path), ()))
        for node in ast.walk(tree):
            target = node.func if isinstance(node, ast.Call) else node
            chain = _chain(target) if isinstance(target, ast.Attribute | ast.Name) else None
            if chain is None or chain[0] not in aliases or (isinstance(node, ast.Name) and node is not target):
                continue
            keywords = tuple(sorted(k.arg for k in node.keywords if k.arg)) if isinstance(node, ast.Call) else ()
            name = ".".join([aliases[chain[0]], *chain[1:]])
            uses.setdefault(name, set()).add((str(path), keywords))
    return uses


def _resolve(name: str):
    """(deepest importable module name, the object or None) in the installed torch."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return module_name, obj
    return "torch", None


class TorchSources:
    """The ``.py`` / ``.pyi`` files of one torch version under ``root`` (``root/torch/...``)."""

    def __init__(self, root: Path):
        if not (root / "torch" / "__init__.py").exists():
            raise SystemExit(f"error: {root} holds no torch/__init__.py; unpack a torch wheel's sources there "
                             "(see this script's docstring)")
        self.root = root
        self.stubs = "\n".join(p.read_text() for p in sorted((root / "torch" / "_C").glob("*.pyi")))

    def module_text(self, module_name: str) -> Optional[str]:
        base = self.root.joinpath(*module_name.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi"), base / "__init__.pyi"):
            if path.exists():
                return path.read_text()
        return None

    def mentions(self, module_name: str, attr: str) -> bool:
        pattern = re.compile(rf"\b{re.escape(attr)}\b")
        text = self.module_text(module_name)
        return text is not None and (bool(pattern.search(text)) or bool(pattern.search(self.stubs)))

    def parameters(self, relative: Path, qualname: str) -> Optional[List[Optional[Set[str]]]]:
        """Parameter names of each definition of ``qualname``'s last part in that file (None: takes **kwargs);
        None when the file or the definition is absent."""
        path = self.root / relative
        if not path.exists():
            return None
        short = qualname.split(".")[-1]
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == short:
                args = node.args
                found.append(None if args.kwarg else {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs})
        return found or None


def _python_function(obj):
    """The Python function behind ``obj`` (a function, or a class's own ``__init__``) inside torch, or None."""
    target = obj.__dict__.get("__init__") if inspect.isclass(obj) else obj
    target = inspect.unwrap(target) if callable(target) else None
    code = getattr(target, "__code__", None)
    if code is None or Path(torch.__file__).parent not in Path(code.co_filename).parents:
        return None
    return target


def audit(uses: Uses, installed: TorchSources, other: TorchSources) -> List[str]:
    findings = []
    for name in sorted(uses):
        module_name, obj = _resolve(name)
        attr = name[len(module_name) + 1:].split(".")[0] if name != module_name else None
        if installed.module_text(module_name) is not None and other.module_text(module_name) is None:
            findings.append(f"{name}: module {module_name} is absent")
            continue
        if attr and installed.mentions(module_name, attr) and not other.mentions(module_name, attr):
            findings.append(f"{name}: {module_name} does not define {attr}")
            continue
        function = _python_function(obj) if obj is not None else None
        if function is None:
            continue
        relative = Path(function.__code__.co_filename).relative_to(installed.root)
        qualname = function.__qualname__
        new, old = installed.parameters(relative, qualname), other.parameters(relative, qualname)
        if new and old is None:
            findings.append(f"{name}: {qualname} is not defined in {relative}")
            continue
        for where, keywords in sorted(uses[name]):
            for keyword in keywords:
                known_here = any(p is None or keyword in p for p in new or [])
                if known_here and old and all(p is not None and keyword not in p for p in old):
                    findings.append(f"{name}: no keyword {keyword!r} (passed in {where})")
    return findings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="directory holding the other version's torch/ sources")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="project whose Python files are read")
    args = parser.parse_args(argv)
    other = TorchSources(args.other)
    installed = TorchSources(Path(torch.__file__).parents[1])
    uses = collect_uses(project_files(args.repo))
    findings = audit(uses, installed, other)
    print(f"{len(uses)} torch names used in {args.repo}; torch {torch.__version__} against {args.other}: "
          f"{len(findings)} missing there")
    for finding in findings:
        print(f"MISSING {finding}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

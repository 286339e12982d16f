"""The package's shape: no import cycle between modules, no lower layer importing a higher one, folders that form a
tree of layers (none split across layers, no loop of folders), a package root of at most 10 modules, no file over 400
lines and no function over 12 parameters (function lengths and the configuration's importers: test_house.py).

The layer order is written down here, once (:data:`LAYERS`). Imports are read with ``ast`` from every module of
``sage_grpo``, those inside functions included (a lazy import is still a dependency), so nothing is imported.
"""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sage_grpo"

# Low to high: a module may import modules of its own layer and of the layers below it, never above. Entries are
# module prefixes below the package (the longest matching prefix places a module); each is a whole folder or a root
# module, never a part of a folder (test_no_folder_is_split_across_layers): the folders form a tree of layers.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("dtypes", "safe_io", "faults", "video_io", "checkpoint_layout"),  # what every layer shares
    ("sde",),  # SDE kernels, the SDE table (torch-free: the config reads its names) and the schedule
    ("rl",),  # advantages, PPO loss, KL, anchor, the KL-controller table, the equalizer, the drift math
    ("config",),  # the sections; --sde_type's and --kl_controller's choices are the tables' names
    ("models",),  # HunyuanVideo-1.5: loading, encoding, attention, LoRA, VAE decode, Placement
    ("distributed",),  # ParallelDims, FSDP2, Ulysses SP
    ("optim",),
    ("toy",),  # the toy world the toy rewards score: rendering, manifold error, analytic velocities
    ("rewards",),
    ("data",),
    ("tracking",),
    ("export",),  # generation reads trained weights through export.weights
    ("pipeline",),  # rollout, replay, the Sampler, generation
    ("plan",),
    ("checkpoint", "resume"),
    ("startup",),  # one start-up resolution (the RunPlan) and the trainer's parts built from it
    ("trainer",),
    ("cli", "studies", "evaluate", "__main__"),  # entry points (python -m sage_grpo), the toy world's studies (they
    # pretrain through the pipeline and run the trainer) and the evaluation
)
MAX_ROOT_MODULES, MAX_LINES, MAX_PARAMETERS = 10, 400, 12


# ---------------------------------------------------------------- the checker (also run on fake packages below)

def module_names(package: Path) -> Dict[str, Path]:
    """Dotted module name (``sage_grpo.models.bundle``; a package by its own name) -> file."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> Tuple[str, List[str]]:
    """The module an import statement imports from ("" for ``import a, b``) and the dotted names it binds
    (``from a import b`` binds ``a.b``)."""
    if isinstance(node, ast.Import):
        return "", [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return "", []
    if node.level:  # relative: resolved against this module's package
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return source, [f"{source}.{alias.name}" for alias in node.names]


def _resolve(target: str, modules: Dict[str, Path]) -> str:
    """The module an imported name lives in: ``pkg.mod.function`` -> ``pkg.mod`` ("" outside the package)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def import_graph(package: Path) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports (anywhere in its body, functions included)."""
    modules = module_names(package)
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            source, names = _imported(node, name, path.name == "__init__.py")
            targets = {_resolve(n, modules) for n in names}  # `from pkg.mod import function` -> pkg.mod
            if source and not any(n in modules for n in names):  # `from pkg import module` uses the module only
                targets.add(_resolve(source, modules))
            graph[name] |= {t for t in targets if t and t != name}
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a sorted list."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def layer_of(module: str, package_name: str, layers: Sequence[Sequence[str]]) -> Optional[int]:
    """The index in ``layers`` of the longest prefix matching ``module`` (None for the package itself)."""
    relative = module[len(package_name) + 1:] if module != package_name else ""
    best: Tuple[int, Optional[int]] = (-1, None)
    for level, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (relative == prefix or relative.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), level)
    return best[1]


def upward_imports(graph: Dict[str, Set[str]], package_name: str,
                   layers: Sequence[Sequence[str]]) -> List[str]:
    """``a -> b`` for each import of a higher layer; a module no layer names is reported too (``a: no layer``)."""
    problems = []
    for module in sorted(graph):
        level = layer_of(module, package_name, layers)
        if level is None:
            if module != package_name:
                problems.append(f"{module}: no layer in LAYERS")
            continue
        for target in sorted(graph[module]):
            target_level = layer_of(target, package_name, layers)
            if target_level is not None and target_level > level:
                problems.append(f"{module} (layer {level}) -> {target} (layer {target_level})")
    return problems


def folder_of(module: str, package_name: str) -> str:
    """The folder (or root module) directly below the package that ``module`` belongs to: ``pkg.models.bundle`` ->
    ``models``, ``pkg.trainer`` -> ``trainer`` ("" for the package itself)."""
    return module[len(package_name) + 1:].split(".")[0] if module != package_name else ""


def folder_graph(graph: Dict[str, Set[str]], package_name: str) -> Dict[str, Set[str]]:
    """Folder -> the other folders its modules import (:func:`folder_of`)."""
    folders: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        source = folder_of(module, package_name)
        if source:
            folders.setdefault(source, set()).update(
                t for t in map(lambda m: folder_of(m, package_name), targets) if t and t != source)
    return folders


def folder_problems(graph: Dict[str, Set[str]], package_name: str, layers: Sequence[Sequence[str]]) -> List[str]:
    """What keeps the folders from being a tree of layers: a folder whose modules sit in more than one layer, a loop
    of folders importing each other, and a folder importing one of a higher layer."""
    placed: Dict[str, Set[int]] = {}
    for module in graph:
        level = layer_of(module, package_name, layers)
        if folder_of(module, package_name) and level is not None:
            placed.setdefault(folder_of(module, package_name), set()).add(level)
    problems = [f"{folder}: split across layers {sorted(levels)}" for folder, levels in sorted(placed.items())
                if len(levels) > 1]
    folders = folder_graph(graph, package_name)
    problems += [f"folder loop: {' <-> '.join(cycle)}" for cycle in find_cycles(folders)]
    for source, targets in sorted(folders.items()):
        problems += [f"{source} (layer {min(placed[source])}) -> {target} (layer {min(placed[target])})"
                     for target in sorted(targets)
                     if source in placed and target in placed and min(placed[target]) > max(placed[source])]
    return problems


def long_signatures(package: Path) -> Dict[str, int]:
    """``file:function`` -> its parameter count, for every function (methods included, ``self`` not counted) with
    more than :data:`MAX_PARAMETERS`."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for parent in ast.walk(tree):
            for node in ast.iter_child_nodes(parent):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs] + ([a.vararg] if a.vararg else []) + \
                    ([a.kwarg] if a.kwarg else [])
                count = len(params) - (1 if isinstance(parent, ast.ClassDef) and params
                                       and params[0].arg in ("self", "cls") else 0)
                if count > MAX_PARAMETERS:
                    found[f"{path.relative_to(package).as_posix()}:{node.name}"] = count
    return found


# ---------------------------------------------------------------- sage_grpo itself

@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGE)


def test_no_import_cycle(graph):
    assert find_cycles(graph) == []


def test_no_lower_layer_imports_a_higher_one(graph):
    assert upward_imports(graph, PACKAGE.name, LAYERS) == []


def test_the_folders_form_a_tree_of_layers(graph):
    """No folder split across layers, no loop of folders, no folder importing a higher one: a folder can be read, moved
    or replaced knowing only the folders below it."""
    assert folder_problems(graph, PACKAGE.name, LAYERS) == []


def test_every_layer_prefix_names_a_module(graph):
    """A stale entry (a moved or deleted folder) would silently place nothing."""
    for prefixes in LAYERS:
        for prefix in prefixes:
            name = f"{PACKAGE.name}.{prefix}"
            assert any(m == name or m.startswith(name + ".") for m in graph), prefix


def test_package_root_holds_at_most_ten_modules():
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules


def test_no_file_over_400_lines():
    lengths = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_no_function_over_12_parameters():
    assert long_signatures(PACKAGE) == {}


# ---------------------------------------------------------------- the checker catches what it should

def _fake_package(root: Path, files: Dict[str, str]) -> Path:
    package = root / "fakepkg"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


FAKE_LAYERS = (("low",), ("high",))


def test_the_checker_reports_a_cycle_through_a_lazy_import(tmp_path):
    package = _fake_package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from fakepkg.low.b import g\n",
        "low/b.py": "def g():\n    from fakepkg.low import a  # inside a function: still an import\n",
        "high.py": "from fakepkg.low.a import g\n",
    })
    graph = import_graph(package)
    assert graph["fakepkg.low.a"] == {"fakepkg.low.b"}
    assert find_cycles(graph) == [["fakepkg.low.a", "fakepkg.low.b"]]
    assert upward_imports(graph, "fakepkg", FAKE_LAYERS) == []  # the cycle is within one layer


def test_the_checker_reports_an_upward_import(tmp_path):
    package = _fake_package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from ..high import thing  # relative, from below\n",
        "high.py": "thing = 1\n",
        "stray.py": "",
    })
    graph = import_graph(package)
    assert find_cycles(graph) == []
    assert upward_imports(graph, "fakepkg", FAKE_LAYERS) == [
        "fakepkg.low.a (layer 0) -> fakepkg.high (layer 1)", "fakepkg.stray: no layer in LAYERS"]


def test_the_checker_places_a_module_by_its_longest_prefix():
    layers = (("toy.world",), ("rewards",), ("toy",))
    assert layer_of("pkg.toy.world", "pkg", layers) == 0
    assert layer_of("pkg.toy.study", "pkg", layers) == 2
    assert layer_of("pkg.toyland", "pkg", layers) is None  # a prefix matches whole names only


def test_the_checker_reports_folders_that_loop_through_a_split_layer(tmp_path):
    """Module by module all is well (no cycle, nothing upward) when a folder is split across layers, yet its folders
    import each other: the folder-level check is what reports it."""
    package = _fake_package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "w = 1\n",
        "low/b.py": "from fakepkg.high.x import v\n",
        "high/__init__.py": "",
        "high/x.py": "from fakepkg.low.a import w\nv = w\n",
    })
    graph = import_graph(package)
    split = (("low.a", "low"), ("high",), ("low.b",))  # low.b placed above high: each module import goes down
    assert find_cycles(graph) == [] and upward_imports(graph, "fakepkg", split) == []
    assert folder_graph(graph, "fakepkg") == {"low": {"high"}, "high": {"low"}}
    assert folder_problems(graph, "fakepkg", split) == ["low: split across layers [0, 2]",
                                                        "folder loop: high <-> low"]
    assert folder_problems(graph, "fakepkg", (("low",), ("high",))) == [
        "folder loop: high <-> low", "low (layer 0) -> high (layer 1)"]


def test_the_checker_counts_parameters_without_self(tmp_path):
    thirteen, twelve = (", ".join(f"p{i}" for i in range(n)) for n in (13, 12))
    package = _fake_package(tmp_path, {
        "__init__.py": f"def wide({thirteen}):\n    pass\n\n\nclass C:\n    def method(self, {twelve}):\n        pass\n",
    })
    assert long_signatures(package) == {"__init__.py:wide": 13}

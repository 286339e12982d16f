"""The plug-in rule: a reward named by a dotted path (``"package.module:attr"`` / ``"package.module.attr"``) loads only
a function or class marked with :func:`reward_plugin` in its own module.

A config file is untrusted input, and it names the plug-in. Before anything is imported, the module is located
without importing it (nor its parent packages) and its source is parsed (``ast``, nothing runs): the named function
or class must be defined there decorated with ``@reward_plugin`` (or assigned ``name = reward_plugin(...)`` at module
level; a comment or string mentioning reward_plugin declares nothing). After the import the named object must carry
the mark itself (not inherit it). So a config can pick among the reward plug-ins installed on the machine, never an
arbitrary callable such as ``subprocess:Popen``, and never makes a module import that is not a reward module. The
reward table and the one resolver that applies this rule are :mod:`sage_grpo.rewards.registry`'s.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from .builtins import BUILTIN_REWARDS


def is_dotted_path(name: str) -> bool:
    """Whether a reward name is a plug-in path (it holds a '.' or ':'); a table name holds neither."""
    return ":" in name or "." in name


PLUGIN_MARK = "__sage_grpo_reward_plugin__"


def reward_plugin(obj):
    """Mark a reward function or class as loadable by dotted path from a config (see the module docstring)::

        from sage_grpo.rewards import reward_plugin

        @reward_plugin
        def my_reward(videos, prompts):   # videos (B, 3, F, H, W) in [0, 1]
            return {"score": videos.mean(dim=(1, 2, 3, 4))}
    """
    if not callable(obj):
        raise TypeError(f"@reward_plugin marks functions and classes, not {type(obj).__name__}")
    setattr(obj, PLUGIN_MARK, True)
    return obj


def _find_spec_without_import(name: str):
    """The import spec of module ``name``, found without importing it or any parent package (None if absent)."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None)
    parent, _, _ = name.rpartition(".")
    search_path = None
    if parent:
        parent_spec = _find_spec_without_import(parent)
        if parent_spec is None or parent_spec.submodule_search_locations is None:
            return None
        search_path = list(parent_spec.submodule_search_locations)
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, search_path) if find_spec is not None else None
        if spec is not None:
            return spec
    return None


def _split_plugin_path(path: str) -> tuple[str, str]:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"plug-in path {path!r} must look like 'package.module:function' or 'package.module.Class'")
    return module_name, attr


def _decorator_name(node: ast.expr) -> str:
    """``reward_plugin`` for ``@reward_plugin``, ``@rewards.reward_plugin`` and ``@reward_plugin(...)``."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def declares_plugin(source: str, attr: str) -> bool | None:
    """Whether module ``source`` declares ``attr`` a reward plug-in where it defines it, read with ``ast`` (nothing
    runs): a ``def`` or ``class`` named ``attr`` (a dotted ``attr`` through the classes' bodies) decorated with
    ``@reward_plugin``, or a module-level assignment ``attr = reward_plugin(...)``. A comment or a string mentioning
    reward_plugin declares nothing. None: the source defines no ``attr`` at all."""
    body = ast.parse(source).body
    *outer, name = attr.split(".")
    for part in outer:
        body = next((node.body for node in body if isinstance(node, ast.ClassDef) and node.name == part), [])
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = any(_decorator_name(d) == "reward_plugin" for d in node.decorator_list)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = (not outer and isinstance(node.value, ast.Call) and _decorator_name(node.value) == "reward_plugin")
    return found


def import_object(path: str):
    """Import the reward plug-in ``"package.module:attr"`` or ``"package.module.attr"`` (``attr`` may be dotted after
    ``:``), enforcing the plug-in rule of the module docstring: the module's source must declare ``attr`` a plug-in
    (:func:`declares_plugin`, checked without importing anything) before it is imported."""
    module_name, attr = _split_plugin_path(path)
    spec = _find_spec_without_import(module_name)
    if spec is None:
        raise ImportError(f"cannot import reward plug-in {path!r}: no module named {module_name!r} (is its package "
                          "installed, or its folder on PYTHONPATH?)")
    origin = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    try:
        declared = origin is not None and declares_plugin(origin.read_text(encoding="utf-8"), attr)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        declared = False  # unreadable, or not Python source: never imported
    if declared is None:
        raise ImportError(f"cannot import reward plug-in {path!r}: {module_name!r} has no attribute {attr!r} of its "
                          "own (a plug-in is defined, and marked with @reward_plugin, in the module it is named by)")
    if not declared:
        raise ImportError(f"refusing reward plug-in {path!r}: {attr!r} is not marked with @reward_plugin where "
                          f"{module_name!r} defines it (checked in its source, without running it). Decorate the "
                          f"reward with @sage_grpo.rewards.reward_plugin, or use a built-in reward: "
                          f"{sorted(BUILTIN_REWARDS)}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import reward plug-in {path!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"cannot import reward plug-in {path!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if getattr(obj, "__dict__", {}).get(PLUGIN_MARK) is not True:
        raise ImportError(f"refusing reward plug-in {path!r}: it is not marked with @reward_plugin in "
                          f"{module_name!r}")
    return obj

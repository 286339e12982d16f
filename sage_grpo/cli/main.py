"""``sage-grpo <verb> [flags...]``: every command of the project under one name.

    sage-grpo train --config configs/tiny_cpu.yaml        sage-grpo generate --prompt "A cat" ...
    sage-grpo export --format pipeline ...               sage-grpo plan --world_size 8 ...
    sage-grpo VERB --help                                 the flags of one verb

Each verb runs the same function as the command it stands for (the table below); those commands stay, so the
reference's scripts and existing launch lines keep working. ``python -m sage_grpo VERB`` is the same command.

Every verb's ``--help`` and errors name it as the user typed it: ``sage-grpo plan`` here, ``python -m sage_grpo plan``
through the package, ``python -m sage_grpo.plan`` when that module runs alone (sage_grpo/config/command.py).
"""

import importlib
import importlib.util
import sys
from typing import Dict, Optional, Sequence, Tuple

from sage_grpo.config.command import run_as

PROG = "sage-grpo"
# verb -> (module, its entry function main(argv), what it does and what it stands for)
VERBS: Dict[str, Tuple[str, str, str]] = {
    "train": ("sage_grpo.cli.train", "main", "post-train with SAGE-GRPO (post_train.py, sage-grpo-train)"),
    "generate": ("sage_grpo.cli.generate", "main", "sample videos, base or trained (generate.py)"),
    "evaluate": ("sage_grpo.evaluate", "main", "score a checkpoint's samples (python -m sage_grpo.evaluate)"),
    "export": ("sage_grpo.cli.export", "main",
               "export a checkpoint for diffusers / peft (scripts/export_checkpoint.py)"),
    "plan": ("sage_grpo.plan.report", "main", "memory plan of a launch (python -m sage_grpo.plan)"),
    "serve-reward": ("sage_grpo.cli.serve_reward", "main", "serve a reward over HTTP (scripts/reward_server.py)"),
    "convert": ("sage_grpo.cli.convert", "main",
                "convert a reference checkpoint (scripts/convert_reference_checkpoint.py)"),
    "verify": ("sage_grpo.cli.verify", "main", "check a model root's files (sage-grpo-verify-weights)"),
    "make-tiny": ("sage_grpo.cli.make_tiny", "main",
                  "write the tiny random-weight checkpoint (scripts/make_tiny_checkpoint.py)"),
    "plot": ("sage_grpo.cli.plot", "main", "plot a run's metrics as a PNG (scripts/plot_run.py)"),
}


def usage(prog: str = PROG) -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {what}" for verb, (_, _, what) in VERBS.items()]
    return f"usage: {prog} <verb> [flags...]   ({prog} <verb> --help for its flags)\n\nverbs:\n" + "\n".join(lines)


def dispatch(verb: str, argv: Sequence[str], prog: str = PROG) -> int:
    """Run ``verb`` with ``argv``, named ``PROG VERB``; its exit status (argparse's --help and errors exit through
    SystemExit)."""
    module_name, function, _ = VERBS[verb]
    if importlib.util.find_spec(module_name) is None:
        print(f"error: {prog} {verb}: {module_name} is not installed in this version of sage-grpo", file=sys.stderr)
        return 2
    entry = getattr(importlib.import_module(module_name), function, None)
    if entry is None:
        print(f"error: {prog} {verb}: {module_name} has no {function}() in this version of sage-grpo", file=sys.stderr)
        return 2
    return run_as(f"{prog} {verb}", entry, argv)


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    """``sage-grpo VERB FLAGS``; ``prog`` is how the command was typed (``python -m sage_grpo`` from __main__.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(prog), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):  # as every command's --help: print, then exit 0
        print(usage(prog))
        sys.exit(0)
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"error: unknown verb {verb!r}\n{usage(prog)}", file=sys.stderr)
        return 2
    return dispatch(verb, rest, prog)


if __name__ == "__main__":
    sys.exit(main())

"""``sage-grpo <verb> [flags...]``: every command of the project under one name.

    sage-grpo train --config configs/tiny_cpu.yaml        sage-grpo generate --prompt "A cat" ...
    sage-grpo export --format pipeline ...               sage-grpo plan --world_size 8 ...
    sage-grpo VERB --help                                 the flags of one verb

Each verb runs the same code as the command it stands for (the table below); those commands stay, so the reference's
scripts and existing launch lines keep working.
"""

import importlib
import importlib.util
import runpy
import sys
from typing import Dict, Optional, Sequence, Tuple

# verb -> (module, function or None to run the module as ``python -m module``, what it does and what it stands for)
VERBS: Dict[str, Tuple[str, Optional[str], str]] = {
    "train": ("sage_grpo.cli.train", "main", "post-train with SAGE-GRPO (post_train.py, sage-grpo-train)"),
    "generate": ("sage_grpo.cli.generate", "main", "sample videos, base or trained (generate.py)"),
    "evaluate": ("sage_grpo.evaluate", "main", "score a checkpoint's samples (python -m sage_grpo.evaluate)"),
    "export": ("sage_grpo.cli.export", "main",
               "export a checkpoint for diffusers / peft (scripts/export_checkpoint.py)"),
    "plan": ("sage_grpo.plan", None, "memory plan of a launch (python -m sage_grpo.plan)"),
    "serve-reward": ("sage_grpo.cli.serve_reward", "main", "serve a reward over HTTP (scripts/reward_server.py)"),
    "convert": ("sage_grpo.cli.convert", "main",
                "convert a reference checkpoint (scripts/convert_reference_checkpoint.py)"),
    "verify": ("sage_grpo.cli.verify", "main", "check a model root's files (sage-grpo-verify-weights)"),
    "make-tiny": ("sage_grpo.cli.make_tiny", "main",
                  "write the tiny random-weight checkpoint (scripts/make_tiny_checkpoint.py)"),
    "plot": ("sage_grpo.cli.plot", "main", "plot a run's metrics as a PNG (scripts/plot_run.py)"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {what}" for verb, (_, _, what) in VERBS.items()]
    return "usage: sage-grpo <verb> [flags...]   (sage-grpo <verb> --help for its flags)\n\nverbs:\n" + "\n".join(lines)


def dispatch(verb: str, argv: Sequence[str]) -> int:
    """Run ``verb`` with ``argv``; its exit status (argparse's --help and errors exit through SystemExit)."""
    module_name, function, _ = VERBS[verb]
    if importlib.util.find_spec(module_name) is None:
        print(f"error: sage-grpo {verb}: {module_name} is not installed in this version of sage-grpo",
              file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [f"sage-grpo {verb}", *argv]  # argparse names the verb in usage lines
    try:
        if function is None:
            runpy.run_module(module_name, run_name="__main__")  # as `python -m module`
            return 0
        entry = getattr(importlib.import_module(module_name), function, None)
        if entry is None:
            print(f"error: sage-grpo {verb}: {module_name} has no {function}() in this version of sage-grpo",
                  file=sys.stderr)
            return 2
        return int(entry(list(argv)) or 0)
    finally:
        sys.argv = saved


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):  # as every command's --help: print, then exit 0
        print(usage())
        sys.exit(0)
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"error: unknown verb {verb!r}\n{usage()}", file=sys.stderr)
        return 2
    return dispatch(verb, rest)


if __name__ == "__main__":
    sys.exit(main())

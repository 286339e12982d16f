"""How a command names itself in its usage line and its errors: as the user typed it.

argparse names a command after ``sys.argv[0]``. A console command puts its own name there (``sage-grpo-train``) and a
script its file (``post_train.py``), but ``python -m package.module`` puts the module's file path, so argparse would
print ``usage: __main__.py`` or ``usage: report.py``. Two callers set the name instead, for the one call they make:

- ``sage-grpo VERB`` (sage_grpo/cli/main.py) runs the verb's function as ``sage-grpo VERB`` (or ``python -m sage_grpo
  VERB`` when the package ran as a program);
- a module run with ``python -m`` (its ``__main__`` block) calls :func:`run_module`, which names it ``python -m
  MODULE``.

Nothing else sets ``sys.argv[0]``. This module imports nothing but ``sys``: it sits below every entry point.
"""

import sys
from typing import Callable, NoReturn, Optional, Sequence

Entry = Callable[[Sequence[str]], Optional[int]]


def run_as(command: str, entry: Entry, argv: Sequence[str]) -> int:
    """``entry(argv)`` with its usage lines naming ``command``; its exit status (None counts as 0). argparse's
    ``--help`` and errors leave through ``SystemExit`` as usual; ``sys.argv`` is put back either way."""
    saved = sys.argv
    sys.argv = [command, *argv]
    try:
        return int(entry(list(argv)) or 0)
    finally:
        sys.argv = saved


def run_module(module: str, entry: Entry) -> NoReturn:
    """The ``__main__`` block of ``python -m MODULE``: run ``entry`` on the command line, named ``python -m MODULE``,
    and exit with its status."""
    sys.exit(run_as(f"python -m {module}", entry, sys.argv[1:]))

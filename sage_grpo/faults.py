"""Fault injection for the crash-and-resume tests (``tests/e2e/test_faults.py``, ``tests/distributed/test_restart.py``).

``SAGE_GRPO_FAULT=<point>:<step>[@<rank>]`` makes the process kill itself with SIGKILL (what an out-of-memory kill or a
lost node does: no handler, no cleanup) when it reaches ``<point>`` while working on global step ``<step>`` (1-based);
with ``@<rank>`` only that rank of a torchrun job dies (a lost worker). Points: ``rollout`` (after the rollout),
``update`` (after the first backward of the policy update), ``checkpoint`` (checkpoint files written to the temporary
directory, not yet renamed), ``metrics`` (half of the step's ``metrics.jsonl`` line written), ``rewrite`` (with a file
name instead of a step: the new content of a file that :func:`sage_grpo.safe_io.atomic_write` replaces is written and
fsynced, not yet renamed over the old one). A fault fires only on a job's first attempt (``TORCHELASTIC_RESTART_COUNT``
unset or 0), so the group torchrun restarts runs through.
Unset (always, outside the tests), :func:`fault_point` does nothing.
"""

import os
import signal
from typing import Union

FAULT_ENV = "SAGE_GRPO_FAULT"
FAULT_POINTS = ("rollout", "update", "checkpoint", "metrics", "rewrite")


def fault_point(point: str, step: Union[int, str]) -> None:
    """Die here if ``SAGE_GRPO_FAULT`` names this point and step (or file name), and this rank if it names one."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    where, _, rank = wanted.partition("@")
    if where == f"{point}:{step}" and (not rank or rank == os.environ.get("RANK", "0")):
        os.kill(os.getpid(), signal.SIGKILL)

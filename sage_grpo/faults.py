"""Fault injection for the crash-and-resume tests (``tests/e2e/test_faults.py``).

``SAGE_GRPO_FAULT=<point>:<step>`` makes the process kill itself with SIGKILL (what an out-of-memory kill or a lost
node does: no handler, no cleanup) when it reaches ``<point>`` while working on global step ``<step>`` (1-based).
Points: ``rollout`` (after the rollout), ``update`` (after the first backward of the policy update), ``checkpoint``
(checkpoint files written to the temporary directory, not yet renamed), ``metrics`` (half of the step's
``metrics.jsonl`` line written). Unset (always, outside the tests), :func:`fault_point` does nothing.
"""

import os
import signal

FAULT_ENV = "SAGE_GRPO_FAULT"
FAULT_POINTS = ("rollout", "update", "checkpoint", "metrics")


def fault_point(point: str, step: int) -> None:
    """Die here if ``SAGE_GRPO_FAULT`` names this point and step."""
    wanted = os.environ.get(FAULT_ENV)
    if wanted and wanted == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)

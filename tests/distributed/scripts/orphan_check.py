"""A torchrun worker that would run for two minutes: it joins the job (which installs the parent-death signal),
writes its pid to ``<dir>/rank<R>.pid`` and keeps meeting its peer. The test kills the agent and expects this
process gone within seconds.

    orphan_check.py <dir>
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from sage_grpo.distributed import barrier, init_distributed  # noqa: E402


def main() -> int:
    env = init_distributed(backend="gloo")
    barrier()
    (Path(sys.argv[1]) / f"rank{env.rank}.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # bounded even if nobody ever kills it
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rank that stops answering (SIGSTOP) in the middle of a step: the other must end within twice the collective
timeout with a message naming it. Run as two processes with RANK/WORLD_SIZE/MASTER_* set (no agent: the test reads
each process's exit itself).

    hung_peer.py <timeout_minutes>
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sage_grpo.distributed import init_distributed  # noqa: E402
from sage_grpo.distributed.liveness import PeerLost, PeerWatch, collective_timeout  # noqa: E402


def main() -> int:
    timeout = collective_timeout(float(sys.argv[1]))
    env = init_distributed(backend="gloo", timeout=timeout)
    watch = PeerWatch(timeout)
    with watch.guard("step 1"):
        dist.all_reduce(torch.ones(4))  # a healthy step first: the group works
    print(f"rank {env.rank}: step 1 done", flush=True)
    if env.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen: no Python, no threads, the sockets stay open
    start = time.monotonic()
    try:
        with watch.guard("step 2"):
            dist.all_reduce(torch.ones(4))
    except PeerLost as err:
        print(f"rank {env.rank}: PeerLost after {time.monotonic() - start:.1f} s: {err}", file=sys.stderr, flush=True)
        return 3
    print(f"rank {env.rank}: step 2 finished although rank 1 is stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

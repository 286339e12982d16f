"""Joining the job: the ranks meet in the job's key-value store (``MASTER_ADDR:MASTER_PORT``: torchrun's agent holds
it, else rank 0) and each waits, at most ``--collective_timeout_minutes`` (30 by default), for all the others.

A rank whose peers never come ends with one line naming them and where it waited (``rank 0 waited 30 min at
127.0.0.1:29500 ...: rank 1 never joined``): before, a ``WORLD_SIZE=2`` process without its peer waited the whole
timeout inside torch and ended in a ``DistStoreError`` traceback, and a rank whose store never came up in a
``DistNetworkError`` one, after C++ logs. The roll call is the one of :class:`~sage_grpo.distributed.liveness.PeerWatch`:
each rank writes its key and polls for the others', so every waiting rank names the missing ones itself.
"""

import os
import socket
import time
from datetime import timedelta
from typing import List

import torch.distributed as dist

from sage_grpo.config.launch_env import LaunchEnv
from sage_grpo.distributed.liveness import PeerLost

POLL_S = 1.0  # the longest pause between two looks at the store


def join_store(launch: LaunchEnv, timeout: timedelta) -> dist.Store:
    """The job's store, once every rank of ``launch`` has joined it, with this attempt's keys under a prefix of their
    own: torchrun keeps one store across ``--max-restarts``, and the process group's keys (each rank's gloo address)
    are the same every attempt, so a restarted rank read a dead rank's address before the new one was written ("Gloo
    connectFullMesh failed ... Connection refused") and the restart failed."""
    agent_holds_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    is_master = launch.rank == 0 and not agent_holds_store
    deadline = time.monotonic() + timeout.total_seconds()
    if not is_master:  # probed with a plain socket first: torch's client logs pages of C++ frames when it gives up
        _wait_for_store(launch, deadline, timeout, "torchrun's agent" if agent_holds_store else "rank 0")
    store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size, is_master=is_master,
                          timeout=timeout, multi_tenant=True, wait_for_workers=False)
    attempt = dist.PrefixStore(f"sage_grpo/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
    missing = _roll_call(attempt, launch, deadline)
    if missing:
        label = "ranks" if len(missing) > 1 else "rank"
        raise PeerLost(f"rank {launch.rank} waited {_minutes(timeout)} at MASTER_ADDR:MASTER_PORT {launch.address} "
                       f"for the {launch.world_size} ranks of WORLD_SIZE={launch.world_size}: {label} "
                       f"{', '.join(map(str, missing))} never joined. Fix: start every rank (torchrun "
                       f"--nproc_per_node {launch.local_world_size} post_train.py ... on each node starts them "
                       "together), or unset WORLD_SIZE to run one process")
    return attempt


def _minutes(timeout: timedelta) -> str:
    return f"{timeout.total_seconds() / 60:g} min (--collective_timeout_minutes)"


def _wait_for_store(launch: LaunchEnv, deadline: float, timeout: timedelta, holder: str) -> None:
    """Return once the store's port accepts a connection; :class:`PeerLost` at ``deadline``."""
    pause = 0.05
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((launch.master_addr, launch.master_port), timeout=max(min(remaining, 5), .1)):
                return
        except OSError:
            if remaining <= 0:
                break
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(2 * pause, POLL_S)
    raise PeerLost(f"rank {launch.rank} waited {_minutes(timeout)} for the job's store at MASTER_ADDR:MASTER_PORT "
                   f"{launch.address}, which {holder} holds, and it never answered: rank 0 is missing or that address "
                   f"is not rank 0's. Fix: start rank 0 (torchrun --nproc_per_node {launch.local_world_size} "
                   "post_train.py ... starts every rank), or set MASTER_ADDR and MASTER_PORT to rank 0's on every rank")


def _roll_call(store: dist.Store, launch: LaunchEnv, deadline: float) -> List[int]:
    """The ranks whose keys did not come by ``deadline`` (empty: every rank joined)."""
    keys = [f"sage_grpo/join/{rank}" for rank in range(launch.world_size)]
    store.set(keys[launch.rank], "here")
    pause = 0.05
    while not store.check(keys) and time.monotonic() < deadline:
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(2 * pause, POLL_S)
    return [rank for rank, key in enumerate(keys) if not store.check([key])]

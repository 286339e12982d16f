"""torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), read and checked once, before any connection: every reader of these variables (the device choice,
the memory plan, the process group) takes them from :func:`read_launch_env`.

Unset variables are one process (``python post_train.py``): rank 0 of a world of 1. A set one must be a non-negative
integer, with ``0 <= RANK < WORLD_SIZE``, ``0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE`` (where torchrun sets
``LOCAL_WORLD_SIZE``; alone, ``LOCAL_RANK`` may pick any GPU, which the process group's start checks), and, before the
process group connects with ``WORLD_SIZE > 1``, the address the ranks meet at (``MASTER_ADDR``, ``MASTER_PORT`` in
1..65535). Anything else is one
``ConfigError`` line naming the variable and what to set instead: ``WORLD_SIZE=abc`` ended in a ``ValueError``
traceback, ``RANK=3 WORLD_SIZE=2`` waited for its peers before the rank was ever compared with the world, and a
missing ``MASTER_ADDR`` ended in a ``KeyError``.
"""

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from sage_grpo.config.validation import ConfigError

TORCHRUN_HINT = "launch with torchrun (torchrun --nproc_per_node N post_train.py ...), which sets them all"


@dataclass(frozen=True)
class LaunchEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _fail(message: str, fix: str) -> None:
    raise ConfigError(f"[launch-env] {message}. Fix: {fix}.")


def _integer(environ: Mapping[str, str], name: str, default: Optional[int]) -> Optional[int]:
    text = environ.get(name, "").strip()
    if not text:
        return default
    if not re.fullmatch(r"\d{1,9}", text):
        _fail(f"{name}={text[:40]!r} is not a non-negative integer",
              f"{TORCHRUN_HINT}; or unset {name} to run one process")
    return int(text)


def read_launch_env(environ: Optional[Mapping[str, str]] = None, *, connecting: bool = False) -> LaunchEnv:
    """The launch as torchrun (or a user) described it in ``environ`` (default ``os.environ``), checked; the meeting
    address only when ``connecting`` (the process group's start: the memory plan and the device need no address)."""
    environ = os.environ if environ is None else environ
    world = _integer(environ, "WORLD_SIZE", 1)
    rank = _integer(environ, "RANK", 0)
    local_world = _integer(environ, "LOCAL_WORLD_SIZE", None)  # unset: LOCAL_RANK may pick any GPU
    local_rank = _integer(environ, "LOCAL_RANK", 0)
    if world < 1:
        _fail("WORLD_SIZE=0: a launch has at least one process", f"{TORCHRUN_HINT}; or unset WORLD_SIZE")
    if rank >= world:
        _fail(f"RANK={rank} is outside WORLD_SIZE={world} (ranks 0 to {world - 1})",
              f"{TORCHRUN_HINT}; or set RANK to one of 0..{world - 1} on each process")
    if local_world is not None and not 1 <= local_world <= world:
        _fail(f"LOCAL_WORLD_SIZE={local_world} must be in [1, WORLD_SIZE={world}] (the processes of this node)",
              TORCHRUN_HINT)
    if local_world is not None and local_rank >= local_world:
        _fail(f"LOCAL_RANK={local_rank} is outside LOCAL_WORLD_SIZE={local_world} (local ranks 0 to "
              f"{local_world - 1}, one per GPU of the node)", TORCHRUN_HINT)
    local_world = world if local_world is None else local_world
    if world == 1 or not connecting:
        return LaunchEnv(rank, world, local_rank, local_world)
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr:
        _fail(f"WORLD_SIZE={world} but MASTER_ADDR is not set: the ranks meet at MASTER_ADDR:MASTER_PORT",
              f"{TORCHRUN_HINT}; or set MASTER_ADDR=<rank 0's host> MASTER_PORT=29500 on every rank "
              "(127.0.0.1 on one node)")
    port = _integer(environ, "MASTER_PORT", 0)
    if not 1 <= port <= 65535:
        _fail(f"WORLD_SIZE={world} needs MASTER_PORT, a port in 1..65535 (got "
              f"{environ.get('MASTER_PORT', 'none')!r})", f"{TORCHRUN_HINT}; or set MASTER_PORT=29500 on every rank")
    return LaunchEnv(rank, world, local_rank, local_world, addr, port)

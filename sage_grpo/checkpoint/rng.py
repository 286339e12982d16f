"""The global RNG states a checkpoint records and a resume restores, as plain data (loadable with
``weights_only=True``), and the seeding of a run's processes."""

import random
from typing import Any, List, Tuple

import numpy as np
import torch
import torch.distributed as dist

from sage_grpo.safe_io import CheckpointError


def capture_rng_state() -> dict:
    """The global RNG states as plain data (tensors, numbers, strings: loadable with ``weights_only=True``)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position,
                                                     has_gauss, cached), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _host_rng_states(state: dict) -> Tuple[tuple, tuple]:
    """The Python and NumPy states of a saved RNG state, as ``setstate`` and ``set_state`` take them."""
    name, keys, position, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)  # earlier versions: a NumPy array
    return (tuple(tuple(x) if isinstance(x, list) else x for x in state["python"]),
            (name, keys.astype(np.uint32), position, has_gauss, cached))


def check_rng_state(state: Any, source: str) -> None:
    """Refuse a saved RNG state (``source`` names it) that the global RNGs would not take: it is restored only
    after the models have loaded, so a wrong one is named here, before (tried on throwaway generators)."""
    try:
        python, numpy_state = _host_rng_states(state)
        random.Random().setstate(python)
        np.random.RandomState().set_state(numpy_state)
        torch.Generator().set_state(state["torch"])
    except Exception as err:  # noqa: BLE001 - a garbled state fails in many ways (KeyError, TypeError, ValueError)
        raise CheckpointError(f"{source} is not a saved RNG state ({type(err).__name__}: {str(err)[:150]})") from None


def restore_rng_state(state: dict) -> List[str]:
    """Set the global RNGs to ``state``; returns notes on what could not be restored. The CUDA states go to the
    devices this process sees, by index: a machine that sees fewer GPUs than the one that saved (another
    ``CUDA_VISIBLE_DEVICES``) restores the first ones and says which were left (rollout noise comes from CPU
    generators, so only CUDA-side randomness such as dropout on the missing devices differs)."""
    notes: List[str] = []
    python, numpy_state = _host_rng_states(state)
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        saved, visible = state["cuda"], torch.cuda.device_count()
        for index, device_state in enumerate(saved[:visible]):
            torch.cuda.set_rng_state(device_state, index)
        if len(saved) > visible:
            notes.append(f"note: the checkpoint holds CUDA RNG states of {len(saved)} GPUs and this process sees "
                         f"{visible}: those of cuda:{visible} to cuda:{len(saved) - 1} are not restored")
    return notes


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def gather_rng_states() -> List[dict]:
    """Every rank's RNG states, in rank order, on every rank (one object all-gather)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, capture_rng_state())
    return states


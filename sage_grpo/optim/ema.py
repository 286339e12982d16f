"""An exponential moving average of the trained weights (``--ema_decay``), as Flow-GRPO and DanceGRPO offer.

After every optimizer update, with decay d and the trained weights θ (all of them, or the LoRA adapter's)::

    θ_ema ← d · θ_ema + (1 − d) · θ            (θ_ema starts as θ when training starts)

θ_ema is kept in fp32 whatever the master weights' dtype, on the weights' device and **sharded like them**: under
FSDP2 each θ_ema tensor is a DTensor with its weight's mesh and placements, so a rank holds and updates only its own
shard (P_g·4/Z bytes; the memory plan counts them) and the update needs no communication.

The checkpoint manager, which owns the state, saves and restores it (``state_dict`` / ``load_state_dict``, keyed like
the trainable weights): ``ema/model.safetensors`` (whole, on rank 0: ``generate.py``, the export and the evaluation
read ``--checkpoint_path checkpoint-N/ema``) and, on several processes, the ``ema`` part of the DCP shards, so a
resume continues the average exactly. ``applied()`` puts θ_ema into the model for a while (validation with
``--validate_ema``) and restores θ exactly afterwards.
"""

import contextlib
from typing import Dict, Iterator, List

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor


def _local(tensor: Tensor) -> Tensor:
    """This rank's shard (the tensor itself when unsharded); in-place changes to it change the tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class PolicyEMA:
    """θ_ema of ``weights``: the trainable state dict of the model bundle, whose tensors share storage with the
    parameters (DTensor shards under FSDP)."""

    def __init__(self, weights: Dict[str, Tensor], decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"--ema_decay {decay} must be in (0, 1)")
        self.decay, self.weights = decay, weights
        self.average = {name: tensor.detach().to(torch.float32).clone() for name, tensor in weights.items()}

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, after an optimizer update: θ_ema ← θ_ema + (1 − d)(θ − θ_ema), shard by shard."""
        averages = [_local(self.average[name]) for name in self.weights]
        current = [_local(tensor).to(torch.float32) for tensor in self.weights.values()]
        torch._foreach_lerp_(averages, current, 1.0 - self.decay)

    def state_dict(self) -> Dict[str, Tensor]:
        return self.average

    @torch.no_grad()
    def load_state_dict(self, state: Dict[str, Tensor]) -> None:
        missing, unexpected = sorted(set(self.average) - set(state)), sorted(set(state) - set(self.average))
        if missing or unexpected:
            raise KeyError(f"the checkpoint's EMA does not match the trained weights: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
        for name, tensor in self.average.items():
            if state[name] is not tensor:  # DCP loads in place
                tensor.copy_(state[name])

    def reset(self) -> None:
        """θ_ema = θ (a resume from a checkpoint without an EMA)."""
        self.load_state_dict({name: tensor.detach() for name, tensor in self.weights.items()})

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The model holds θ_ema inside the block and θ again after it, bit for bit: fp32 weights are swapped with
        the average one tensor at a time (no extra memory); weights of another dtype are kept aside meanwhile."""
        weights = [_local(tensor) for tensor in self.weights.values()]
        averages = [_local(self.average[name]) for name in self.weights]
        kept: List[Tensor] = []
        for weight, average in zip(weights, averages):
            if weight.dtype == average.dtype:
                _swap(weight, average)
            else:
                kept.append(weight.clone())
                weight.copy_(average)
        try:
            yield
        finally:
            kept.reverse()
            for weight, average in zip(weights, averages):
                if weight.dtype == average.dtype:
                    _swap(weight, average)
                else:
                    weight.copy_(kept.pop())


def _swap(first: Tensor, second: Tensor) -> None:
    held = first.clone()
    first.copy_(second)
    second.copy_(held)

"""The few collectives the trainer calls outside the model (docs/reference.md#randomness-across-ranks,
docs/reference.md#collectives-per-step).

Each helper is a no-op (returns its input) on one process or when its group is absent, so the trainer calls them
unconditionally. All of them must be called by every rank of the group at the same point.

- :func:`broadcast_from_sp_leader` / :func:`broadcast_object_from_sp_leader`: make a value computed on sp_rank 0
  (rewards, shuffles, timestep permutations, SDE noise) identical on the whole SP group. The reference relies on
  identical RNG consumption for this (docs/reference.md#d11); we broadcast explicitly.
  :func:`broadcast_object_from_main` does the same from rank 0 to every rank (the validation metrics, computed on the
  main process).
- :func:`all_gather_in_group`: concatenate same-shaped tensors along dim 0 in group-rank order, e.g. the rewards of a
  prompt group spread over several DP ranks (``ParallelDims.prompt_group``) or reward statistics over the world.
- :func:`mean_over_world`: average a dict of float metrics over all ranks in one all-reduce (gloo has no AVG op, so
  SUM then divide).
- :func:`average_gradients`: the gradient mean FSDP would do, for a model that is not FSDP-wrapped.
"""

from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch
import torch.distributed as dist

from sage_grpo.distributed.parallel_dims import ParallelDims


def _active(group: Optional[dist.ProcessGroup]) -> bool:
    return dist.is_initialized() and group is not None and dist.get_world_size(group) > 1


def broadcast_from_sp_leader(tensor: torch.Tensor, dims: ParallelDims) -> torch.Tensor:
    """Overwrite ``tensor`` in place with sp_rank 0's copy; returns it. The tensor must be on ``dims.device``."""
    if dims.sp_enabled and _active(dims.sp_group):
        dist.broadcast(tensor, group=dims.sp_group, group_src=0)
    return tensor


def broadcast_object_from_sp_leader(obj: Any, dims: ParallelDims) -> Any:
    """sp_rank 0's picklable ``obj`` on every rank of the SP group (the argument is ignored on other ranks)."""
    if not (dims.sp_enabled and _active(dims.sp_group)):
        return obj
    holder: List[Any] = [obj]
    dist.broadcast_object_list(holder, group=dims.sp_group, group_src=0,
                               device=dims.device if dims.device.type == "cuda" else None)
    return holder[0]


def all_gather_in_group(tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """``cat`` over the group's ranks (in group-rank order) of a tensor with the same shape on every rank."""
    if not _active(group):
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=0)


def all_gather_world(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`all_gather_in_group` over every rank (rank order)."""
    return all_gather_in_group(tensor, dist.group.WORLD if dist.is_initialized() else None)


def mean_over_world(metrics: Mapping[str, float], device: torch.device) -> Dict[str, float]:
    """Average each metric over all ranks (one fp64 all-reduce, keys in the caller's order, which must match)."""
    names = list(metrics)
    if not names or not _active(dist.group.WORLD if dist.is_initialized() else None):
        return {name: float(metrics[name]) for name in names}
    values = torch.tensor([float(metrics[name]) for name in names], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    values /= dist.get_world_size()
    return dict(zip(names, values.tolist()))


def mean_tensor_over_world(value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over all ranks, computed on the device (no host copy); the tensor itself on one process."""
    if not _active(dist.group.WORLD if dist.is_initialized() else None):
        return value
    total = value.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def average_gradients(parameters: Iterable[torch.nn.Parameter], group: Optional[dist.ProcessGroup]) -> None:
    """Replace plain (non-FSDP) gradients by their mean over ``group``.

    FSDP does this itself; without FSDP, averaging over the SP group is the Ulysses gradient correction
    (``sequence_parallel.py``) and averaging over the world adds the data-parallel mean.
    """
    if not _active(group):
        return
    size = dist.get_world_size(group)
    for param in parameters:
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
            param.grad.div_(size)


def barrier(device: Optional[torch.device] = None) -> None:
    """``dist.barrier`` when a process group exists (pins the NCCL device to avoid a guessed one)."""
    if dist.is_initialized():
        if device is not None and device.type == "cuda":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()


def broadcast_object_from_main(obj: Any) -> Any:
    """Rank 0's picklable ``obj`` on every rank (the argument is ignored on the other ranks); ``obj`` itself on one
    process."""
    if not _active(dist.group.WORLD if dist.is_initialized() else None):
        return obj
    holder: List[Any] = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def first_message_over_world(message: str) -> str:
    """The first non-empty ``message`` of the ranks, in rank order, on every rank ("" when every rank gave ""); the
    message itself on one process."""
    if not _active(dist.group.WORLD if dist.is_initialized() else None):
        return message
    messages: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    return next((str(text) for text in messages if text), "")

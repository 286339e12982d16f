"""Activation memory of the dual-stream blocks, measured and as the memory planner predicts it.

:class:`SavedBytes` counts what one block saves for its backward on every device, through
``torch.autograd.graph.saved_tensors_hooks``: the storages autograd saves during a forward, each counted once (a view
or a tensor saved by two ops shares its storage), the parameters left out, each attributed to the block during whose
call it was first saved, else to ``outside`` (embedders, token refiner, output layers). Under activation
checkpointing a block keeps only its inputs, which torch's non-reentrant checkpoint saves through the outer hook
*before* the block runs: the meter therefore enables checkpointing with its own checkpoint function, the same
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` diffusers uses by default, that marks the block first.

The first block also holds what every block shares (RoPE tables, the timestep embedding, the text mask, and under
checkpointing the untrimmed text it receives): :attr:`BlockMemory.per_block` is the mean over the blocks after the
first, or the first alone in a one-block model. :func:`planned_block_bytes` is the planner's figure for it:
:func:`~sage_grpo.plan.sizes.block_saved_elements` (checkpointing off) or
:func:`~sage_grpo.plan.sizes.checkpointed_block_elements` (on), per sample, times the rows and the bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch.utils.checkpoint import checkpoint

from sage_grpo.plan.sizes import block_saved_elements, checkpointed_block_elements, transformer_sizes

OUTSIDE = -1  # owner of the storages first saved outside every dual-stream block


@dataclass(frozen=True)
class BlockMemory:
    """Bytes saved for backward in one forward: per dual-stream block (index order) and outside the blocks."""

    blocks: List[int]
    outside: int

    @property
    def per_block(self) -> float:
        """One block's saves: the mean of the blocks after the first (see the module docstring)."""
        typical = self.blocks[1:] or self.blocks
        return sum(typical) / len(typical)

    @property
    def total(self) -> int:
        return sum(self.blocks) + self.outside


class SavedBytes:
    """Context manager metering one forward of ``transformer`` (a ``HunyuanVideo15Transformer3DModel``): on exit,
    :attr:`result` holds the :class:`BlockMemory`. ``checkpointing`` switches the model's activation checkpointing
    for the forward (restored to off on exit)."""

    def __init__(self, transformer: torch.nn.Module, checkpointing: bool):
        self.transformer = transformer
        self.checkpointing = checkpointing
        self.result: Optional[BlockMemory] = None
        self._index = {id(block): i for i, block in enumerate(transformer.transformer_blocks)}
        self._parameters = {p.untyped_storage().data_ptr() for p in transformer.parameters()}
        self._owner = OUTSIDE
        self._saved: Dict[int, tuple] = {}  # storage address -> (owner, bytes)
        self._handles: list = []
        self._hooks = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._parameters and key not in self._saved:
            self._saved[key] = (self._owner, storage.nbytes())
        return tensor  # the saved tensor itself: the meter changes nothing autograd keeps

    def _enter_block(self, block, *args) -> None:
        self._owner = self._index[id(block)]

    def _leave_block(self, block, *args) -> None:
        self._owner = OUTSIDE

    def _checkpointed(self, block: torch.nn.Module, *args):
        self._enter_block(block)  # before checkpoint saves the block's inputs
        return checkpoint(block.__call__, *args, use_reentrant=False)

    def __enter__(self) -> "SavedBytes":
        for block in self.transformer.transformer_blocks:
            self._handles += [block.register_forward_pre_hook(self._enter_block),
                              block.register_forward_hook(self._leave_block)]
        if self.checkpointing:
            self.transformer.enable_gradient_checkpointing(gradient_checkpointing_func=self._checkpointed)
        else:
            self.transformer.disable_gradient_checkpointing()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self.transformer.disable_gradient_checkpointing()
        blocks = [0] * len(self.transformer.transformer_blocks)
        outside = 0
        for owner, size in self._saved.values():
            if owner == OUTSIDE:
                outside += size
            else:
                blocks[owner] += size
        self.result = BlockMemory(blocks, outside)


def measure_saved_bytes(transformer: torch.nn.Module, forward: Callable[[], torch.Tensor],
                        checkpointing: bool) -> BlockMemory:
    """The :class:`BlockMemory` of one ``forward()`` (grad enabled; the graph is freed after)."""
    with SavedBytes(transformer, checkpointing) as meter:
        out = forward()
    del out
    return meter.result


def planned_block_bytes(config: Dict, video_tokens: int, text_tokens: int, sp: int, rows: int, bytes_per_element: int,
                        checkpointing: bool) -> int:
    """The planner's bytes of one block's saves for ``rows`` samples of ``video_tokens`` latent tokens (N) and
    ``text_tokens`` text tokens in the blocks (T), on one of ``sp`` SP ranks."""
    sizes = transformer_sizes(config)
    formula = checkpointed_block_elements if checkpointing else block_saved_elements
    return rows * formula(sizes, video_tokens, text_tokens, sp) * bytes_per_element


@dataclass(frozen=True)
class CudaMemory:
    """``torch.cuda`` allocator numbers of one training pass, in bytes: what the forward leaves allocated for the
    backward (activations and outputs), and the peak during forward + backward, both above the allocation before."""

    forward_kept: int
    peak: int


def measure_cuda_memory(device: torch.device, forward: Callable[[], torch.Tensor]) -> CudaMemory:
    """Allocator numbers of ``forward()`` and the backward of a scalar of its output, on a CUDA ``device``."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = forward()
    torch.cuda.synchronize(device)
    kept = torch.cuda.memory_allocated(device) - before
    out.float().square().mean().backward()
    del out
    torch.cuda.synchronize(device)
    return CudaMemory(forward_kept=kept, peak=torch.cuda.max_memory_allocated(device) - before)

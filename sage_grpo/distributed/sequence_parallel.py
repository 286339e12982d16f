"""Ulysses sequence parallelism for diffusers' ``HunyuanVideo15Transformer3DModel``, applied from outside the model.

The reference builds SP into its DiT forward (docs/reference.md#sequence-parallelism); here the diffusers class is
used unchanged and :func:`apply_sequence_parallel` installs

1. a forward hook on ``x_embedder`` keeping this rank's ``N / sp`` image tokens (a contiguous chunk, rank order),
2. a forward hook on ``rope`` keeping the same rows of the RoPE cos/sin tables,
3. :class:`UlyssesAttnProcessor` on every dual-stream block: the local image Q/K/V ``(B, N/sp, H, D)`` go through an
   all-to-all that scatters heads and gathers the sequence, giving ``(B, N, H/sp, D)``; the text tokens, replicated
   on every rank, are projected in full and sliced to the same ``H/sp`` heads; attention runs over the *full*
   sequence with the same key-padding mask as without SP (``sage_grpo/models/attention.py``; the text is trimmed by
   the forward that module installs); a reverse all-to-all returns the image output to ``(B, N/sp, H, D)`` and the
   text output is all-gathered over heads before ``to_add_out``;
4. a forward hook on ``proj_out`` all-gathering the image tokens, so every SP rank returns the full velocity.

Everything else (time/text embedders, token refiner, modulation, feed-forwards, norms) is per-token or replicated and
runs unchanged. The result is exact: each attention head sees the same tokens, mask and RoPE as without SP.

Gradients. The collectives are torch's differentiable functional collectives, whose backward is the exact adjoint
(all-to-all <-> all-to-all, all-gather <-> reduce-scatter-sum). Because every SP rank computes the same loss ``L`` on
the same full output, the backward computes the gradient of ``sp * L`` summed over the group's replicas of the
parameters: each rank's raw parameter gradient is partial, and their **mean** over the SP group is exactly ``dL/dθ``.
FSDP2's mean reduction over the flattened ``dp x sp`` mesh performs that mean (see ``parallel_dims.py``); without
FSDP, average the gradients over ``ParallelDims.sp_group`` yourself. The reference's all-gathers (the same two) hand
each rank only its own slice of the gradient instead: its mean is 1/sp of ``dL/dθ`` in norm but differs in direction
for the text queries of every block but the last (docs/differences.md, ``benchmarks/sp_reference_gradient.py``).

Requirements: ``num_attention_heads % sp == 0`` (decided at setup by ``ParallelDims``; only asserted here) and a latent
token count ``F * H * W`` (after patching) divisible by ``sp`` (checked once per token count, ``ConfigError``
otherwise; a forward of a known shape costs a cache lookup). Every rank of
the SP group must call the model with identical inputs.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from einops import rearrange
from torch.distributed import _functional_collectives as funcol
from torch.utils.hooks import RemovableHandle

from sage_grpo.config.validation import check_sequence_parallel_tokens
from sage_grpo.models.attention import joint_attention, joint_projections

_STATE_ATTR = "_sage_sequence_parallel"


def differentiable_all_gather(collectives=funcol):
    """torch's differentiable all-gather along dim 0, under this torch's name for it.

    torch 2.13 calls it ``all_gather_single_autograd`` and keeps ``all_gather_tensor_autograd`` only as a deprecated
    alias (a FutureWarning on every call); torch 2.11, the GPU image's, has only ``all_gather_tensor_autograd``.
    Both take ``(tensor, gather_dim, group)`` and return the same concatenation."""
    return getattr(collectives, "all_gather_single_autograd", None) or collectives.all_gather_tensor_autograd


_all_gather_autograd = differentiable_all_gather()


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup, sp: int) -> torch.Tensor:
    """(B, N/sp, H, D) sequence-sharded -> (B, N, H/sp, D) head-sharded. The all-to-all's first dimension is the
    rank: rank r is sent head group r of this sequence chunk and returns its own head group of chunk r."""
    send = rearrange(x, "b n (r h) d -> r b n h d", r=sp).contiguous()
    recv = funcol.all_to_all_single_autograd(send, None, None, group)  # r = the source rank's sequence chunk
    return rearrange(recv, "r b n h d -> b (r n) h d")


def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup, sp: int) -> torch.Tensor:
    """(B, N, H/sp, D) head-sharded -> (B, N/sp, H, D) sequence-sharded (the inverse of :func:`_seq_to_heads`)."""
    send = rearrange(x, "b (r n) h d -> r b n h d", r=sp).contiguous()
    recv = funcol.all_to_all_single_autograd(send, None, None, group)  # r = the source rank's head group
    return rearrange(recv, "r b n h d -> b n (r h) d")


def _all_gather(x: torch.Tensor, dim: int, group: dist.ProcessGroup, sp: int) -> torch.Tensor:
    """Concatenate the group's tensors along ``dim`` in rank order (differentiable: backward is reduce-scatter-sum)."""
    stacked = _all_gather_autograd(x.contiguous(), 0, group)  # (sp * x.shape[0], ...)
    return torch.cat(stacked.chunk(sp, dim=0), dim=dim)


def local_chunk(x: torch.Tensor, dim: int, sp: int, sp_rank: int) -> torch.Tensor:
    """Rank ``sp_rank``'s contiguous chunk of ``x`` along ``dim`` (the token count checked divisible by ``sp``)."""
    check_sequence_parallel_tokens(x.shape[dim], sp)
    return x.chunk(sp, dim=dim)[sp_rank]


class UlyssesAttnProcessor:
    """Drop-in for :class:`~sage_grpo.models.attention.JointAttnProcessor` (same call signature, trimmed text mask,
    same attention dispatch and backend)."""

    def __init__(self, group: dist.ProcessGroup, attention_backend=None):
        self.group = group
        self.sp_size = dist.get_world_size(group)
        self.sp_rank = dist.get_rank(group)
        self._attention_backend = attention_backend  # whatever diffusers backend the replaced processor used
        self._parallel_config = None

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        if encoder_hidden_states is None:
            raise ValueError("UlyssesAttnProcessor serves HunyuanVideo-1.5 joint attention; text tokens are required")
        heads_local = attn.heads // self.sp_size

        # Image stream: local tokens, all heads (RoPE rows were sharded to match by the rope hook); text stream:
        # replicated tokens, of which this rank keeps the head slice it receives for the image stream.
        (query, key, value), (text_q, text_k, text_v) = joint_projections(attn, hidden_states, encoder_hidden_states,
                                                                          image_rotary_emb)
        query, key, value = (self.seq_to_heads(t) for t in (query, key, value))  # (B, N, H/sp, D)
        num_image_tokens = query.shape[1]
        heads = slice(self.sp_rank * heads_local, (self.sp_rank + 1) * heads_local)
        query = torch.cat([query, text_q[:, :, heads]], dim=1)
        key = torch.cat([key, text_k[:, :, heads]], dim=1)
        value = torch.cat([value, text_v[:, :, heads]], dim=1)

        # The same key-padding mask or split calls as without SP (attention.py), over [all image tokens, text slots].
        out = joint_attention(query, key, value, attention_mask, num_image_tokens, self._attention_backend)
        out = out.to(query.dtype)  # (B, N + L, H/sp, D)

        image_out = self.heads_to_seq(out[:, :num_image_tokens]).flatten(2, 3)  # (B, N/sp, H*D)
        image_out = attn.to_out[1](attn.to_out[0](image_out))
        text_out = self.gather_heads(out[:, num_image_tokens:]).flatten(2, 3)  # (B, L, H*D)
        text_out = attn.to_add_out(text_out)
        return image_out, text_out

    # The three collectives, one method each (benchmarks/sp_emulation.py replaces them by local copies).
    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        return _seq_to_heads(x, self.group, self.sp_size)

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        return _heads_to_seq(x, self.group, self.sp_size)

    def gather_heads(self, x: torch.Tensor) -> torch.Tensor:
        return _all_gather(x, 2, self.group, self.sp_size)


@dataclass
class _SequenceParallelState:
    group: dist.ProcessGroup
    handles: List[RemovableHandle]
    original_processors: Dict[int, object]  # block index -> processor


def apply_sequence_parallel(transformer: torch.nn.Module, sp_group: Optional[dist.ProcessGroup]) -> None:
    """Shard a HunyuanVideo-1.5 transformer's image tokens over ``sp_group`` (no-op for None or a group of one).

    Works before or after ``apply_fsdp`` and with gradient checkpointing. Undo with :func:`remove_sequence_parallel`.
    """
    if sp_group is None or dist.get_world_size(sp_group) == 1:
        return
    if getattr(transformer, _STATE_ATTR, None) is not None:
        raise RuntimeError("sequence parallelism is already applied to this transformer")
    sp, sp_rank = dist.get_world_size(sp_group), dist.get_rank(sp_group)
    num_heads = transformer.config.num_attention_heads
    # Decided at setup (check_parallel_layout, through ParallelDims with the checkpoint's head count); the all-to-all
    # splits the heads evenly over the group, so an uneven count here means a caller skipped that check.
    assert num_heads % sp == 0, f"{num_heads} attention heads do not split over sp {sp}; see check_parallel_layout"

    original = {}
    for index, block in enumerate(transformer.transformer_blocks):
        original[index] = block.attn.processor
        block.attn.set_processor(UlyssesAttnProcessor(sp_group, getattr(block.attn.processor, "_attention_backend",
                                                                        None)))
    handles = [
        # (B, N, C) -> (B, N/sp, C)
        transformer.x_embedder.register_forward_hook(
            lambda module, args, out: local_chunk(out, 1, sp, sp_rank)),
        # (cos, sin), each (N, D) -> (N/sp, D)
        transformer.rope.register_forward_hook(
            lambda module, args, out: tuple(local_chunk(t, 0, sp, sp_rank) for t in out)),
        # (B, N/sp, C_out) -> (B, N, C_out) on every rank
        transformer.proj_out.register_forward_hook(
            lambda module, args, out: _all_gather(out, 1, sp_group, sp)),
    ]
    setattr(transformer, _STATE_ATTR, _SequenceParallelState(sp_group, handles, original))


def remove_sequence_parallel(transformer: torch.nn.Module) -> None:
    """Restore the processors and remove the hooks installed by :func:`apply_sequence_parallel` (no-op if none)."""
    state: Optional[_SequenceParallelState] = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return
    for handle in state.handles:
        handle.remove()
    for index, processor in state.original_processors.items():
        transformer.transformer_blocks[index].attn.set_processor(processor)
    setattr(transformer, _STATE_ATTR, None)


def sequence_parallel_group(transformer: torch.nn.Module) -> Optional[dist.ProcessGroup]:
    """The SP group the transformer is sharded over, or None."""
    state = getattr(transformer, _STATE_ATTR, None)
    return state.group if state is not None else None

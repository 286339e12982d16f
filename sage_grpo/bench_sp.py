"""One rank of Ulysses sequence parallelism on one device: the benchmarks' ``--sp N`` (issue 16, item 2).

:func:`emulate_sp_rank` makes a transformer compute what rank 0 of an SP group of ``sp`` computes under
:func:`sage_grpo.distributed.sequence_parallel.apply_sequence_parallel`, with the same tensor shapes, FLOPs and saved
activations, and no process group: the streams (norms, projections, MLPs, modulation) and the output projection run
on N/sp image tokens and the T replicated text tokens; attention runs over the whole sequence S = N + T with H/sp
heads. This is also how the memory planner models SP (``sage_grpo.plan_sizes.block_saved_elements``: n = N/sp tokens
per stream, 4·S·D/sp attention saves).

The collectives are replaced by local copies of the same shapes (the all-to-alls by a head slice repeated along the
sequence and a sequence slice repeated along the heads, the all-gathers by repeats): the values are not those of a
real group, so the output is not the model's velocity, and the time of the communication itself is not measured
(NCCL over NVLink at these sizes is a separate, small term). Use it to time and size one rank, never to check results.
"""

from typing import Optional, Tuple

import torch

from sage_grpo.config.validation import ConfigError, check_sequence_parallel_tokens
from sage_grpo.models.attention import dispatch, joint_projections, key_padding_mask


def _seq_to_heads(x: torch.Tensor, sp: int) -> torch.Tensor:
    """(B, N/sp, H, D) -> (B, N, H/sp, D): the all-to-all's output shape (rank 0's head group of every chunk)."""
    return x[:, :, : x.shape[2] // sp].repeat(1, sp, 1, 1)


def _heads_to_seq(x: torch.Tensor, sp: int) -> torch.Tensor:
    """(B, N, H/sp, D) -> (B, N/sp, H, D): the reverse all-to-all's output shape."""
    return x[:, : x.shape[1] // sp].repeat(1, 1, sp, 1)


class OneRankUlyssesProcessor:
    """:class:`~sage_grpo.distributed.sequence_parallel.UlyssesAttnProcessor`'s computation on rank 0 of ``sp``, its
    collectives replaced by local copies of the same shapes."""

    def __init__(self, sp: int, attention_backend: Optional[str] = None):
        self.sp = sp
        self._attention_backend = attention_backend
        self._parallel_config = None

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        if encoder_hidden_states is None:
            raise ValueError("OneRankUlyssesProcessor serves HunyuanVideo-1.5 joint attention: text tokens are needed")
        sp, heads_local = self.sp, attn.heads // self.sp
        (query, key, value), (text_q, text_k, text_v) = joint_projections(attn, hidden_states, encoder_hidden_states,
                                                                          image_rotary_emb)
        query, key, value = (_seq_to_heads(t, sp) for t in (query, key, value))  # (B, N, H/sp, D)
        num_image_tokens = query.shape[1]
        query = torch.cat([query, text_q[:, :, :heads_local]], dim=1)
        key = torch.cat([key, text_k[:, :, :heads_local]], dim=1)
        value = torch.cat([value, text_v[:, :, :heads_local]], dim=1)
        out = dispatch(query, key, value, key_padding_mask(attention_mask, num_image_tokens), self._attention_backend)
        out = out.to(query.dtype)  # (B, N + L, H/sp, D)
        image_out = attn.to_out[1](attn.to_out[0](_heads_to_seq(out[:, :num_image_tokens], sp).flatten(2, 3)))
        text_out = attn.to_add_out(out[:, num_image_tokens:].repeat(1, 1, sp, 1).flatten(2, 3))  # the heads gather
        return image_out, text_out


def _first_chunk(x: torch.Tensor, dim: int, sp: int) -> torch.Tensor:
    check_sequence_parallel_tokens(x.shape[dim], sp)
    return x.chunk(sp, dim=dim)[0]


def emulate_sp_rank(transformer: torch.nn.Module, sp: int, attention_backend: Optional[str]) -> None:
    """Make ``transformer`` (joint attention installed) compute rank 0's share of an SP group of ``sp`` (see the
    module docstring); ``sp`` = 1 leaves it unchanged. Raises ``ConfigError`` when the heads do not divide by ``sp``
    (the token count is checked on every forward, as under real SP)."""
    if sp == 1:
        return
    heads = transformer.config.num_attention_heads
    if sp < 1 or heads % sp:
        raise ConfigError(f"--sp {sp}: the transformer has {heads} attention heads; pick a divisor of {heads} "
                          f"(e.g. --sp 2), or --sp 1 for no sequence parallelism")
    for block in transformer.transformer_blocks:
        block.attn.set_processor(OneRankUlyssesProcessor(sp, attention_backend))
    transformer.x_embedder.register_forward_hook(lambda module, args, out: _first_chunk(out, 1, sp))
    transformer.rope.register_forward_hook(lambda module, args, out: tuple(_first_chunk(t, 0, sp) for t in out))
    transformer.proj_out.register_forward_hook(lambda module, args, out: out.repeat(1, sp, 1))

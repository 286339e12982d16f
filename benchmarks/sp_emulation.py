"""One rank of Ulysses sequence parallelism on one device: the benchmarks' ``--sp N``.

:func:`emulate_sp_rank` makes a transformer compute what rank 0 of an SP group of ``sp`` computes under
:func:`sage_grpo.distributed.sequence_parallel.apply_sequence_parallel`, with the same tensor shapes, FLOPs and saved
activations, and no process group: the streams (norms, projections, MLPs, modulation) and the output projection run
on N/sp image tokens and the T replicated text tokens; attention runs over the whole sequence S = N + T with H/sp
heads. This is also how the memory planner models SP (``sage_grpo.plan.sizes.block_saved_elements``: n = N/sp tokens
per stream, 4·S·D/sp attention saves).

The collectives are replaced by local copies of the same shapes (the all-to-alls by a head slice repeated along the
sequence and a sequence slice repeated along the heads, the all-gathers by repeats): the values are not those of a
real group, so the output is not the model's velocity, and the time of the communication itself is not measured
(NCCL over NVLink at these sizes is a separate, small term). Use it to time and size one rank, never to check results.
"""

from typing import Optional

import torch

from sage_grpo.config.validation import ConfigError
from sage_grpo.distributed.sequence_parallel import UlyssesAttnProcessor, local_chunk


class OneRankUlyssesProcessor(UlyssesAttnProcessor):
    """:class:`~sage_grpo.distributed.sequence_parallel.UlyssesAttnProcessor`'s computation on rank 0 of ``sp`` (its
    own ``__call__``), the collectives replaced by local copies of the same shapes."""

    def __init__(self, sp: int, attention_backend: Optional[str] = None):  # no process group: rank 0 of sp
        self.group, self.sp_size, self.sp_rank = None, sp, 0
        self._attention_backend = attention_backend
        self._parallel_config = None

    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N/sp, H, D) -> (B, N, H/sp, D): the all-to-all's output shape (rank 0's head group of every chunk)."""
        return x[:, :, : x.shape[2] // self.sp_size].repeat(1, self.sp_size, 1, 1)

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, H/sp, D) -> (B, N/sp, H, D): the reverse all-to-all's output shape."""
        return x[:, : x.shape[1] // self.sp_size].repeat(1, 1, self.sp_size, 1)

    def gather_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, H/sp, D) -> (B, L, H, D): the heads all-gather's output shape."""
        return x.repeat(1, 1, self.sp_size, 1)


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
    transformer.x_embedder.register_forward_hook(lambda module, args, out: local_chunk(out, 1, sp, 0))
    transformer.rope.register_forward_hook(lambda module, args, out: tuple(local_chunk(t, 0, sp, 0) for t in out))
    transformer.proj_out.register_forward_hook(lambda module, args, out: out.repeat(1, sp, 1))

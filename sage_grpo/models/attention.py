"""Joint attention of the HunyuanVideo-1.5 dual-stream blocks without dense masks, on a chosen diffusers backend.

diffusers' ``HunyuanVideo15AttnProcessor2_0`` builds a dense ``(B, 1, S, S)`` boolean mask over the joint sequence
``S = N image tokens + L text slots`` (1000 MLLM + 256 byT5 + 729 image slots for the released model, mostly padding)
in every block. At ``S ~ 20k`` that mask is 400 MB per sample and no flash kernel accepts it. Two facts make it
unnecessary:

* the transformer's forward orders each sample's text slots valid-first (valid image, byT5, MLLM tokens, then the
  padding), so the padding is a tail: trimmed to the batch's longest valid length, nothing a valid token attends to
  is lost. A padded slot never influences a valid token (it is masked as a key in every block, and every other
  operation is per token), so the valid tokens' outputs are unchanged; the velocity comes from image tokens only;
* what remains is a key-padding mask (a padded query's output is never used), ``(B, 1, 1, S)``, and none at all when
  no sample of the batch has padding left (one sample per forward, or equal valid lengths).

Rows of different valid lengths (the CFG pair: the empty negative prompt next to the positive one) keep that key mask
in every attention call, which keeps torch SDPA off its flash kernel on a GPU and costs the CPU's kernel time too.
``--mixed_length_attention split`` (:func:`split_rows_of`) runs them mask-free instead: one call per run of
consecutive rows with the same valid length, each over its own keys (the image tokens and its valid text), the
queries untouched, so every token, padded ones included, attends to exactly the keys the mask lets through. The
outputs equal the masked call's within float order (the kernel sums over fewer keys: not bit for bit), which is why
``auto`` keeps the mask on the CPU (the golden run is pinned bit for bit) and splits on CUDA. Measured on the CPU
(``benchmarks/benchmark_mixed_length_attention.py``, ``docs/benchmarks.md``): the split calls beat the masked one at
every size, while torch's nested-tensor (jagged) SDPA and eager flex attention, the variable-length paths there, are
3-47x slower than the masked call (and flex attention has no CPU backward).

:func:`install_joint_attention` puts :class:`JointAttnProcessor` on every dual-stream block and makes the transformer
run :func:`~sage_grpo.models.transformer_forward.joint_forward`, which orders the text valid-first and trims it to
the longest valid length before the blocks, from a layout decided once per prompt batch (no host sync per forward).
The Ulysses processor (``sequence_parallel.py``) shares :func:`joint_projections` and
:func:`key_padding_mask`. ``--attention_backend`` names a backend of diffusers' attention dispatcher
(``native`` = torch SDPA, ``flash``, ``flash_varlen``, ``sage``, ... where installed); a backend that cannot take a
mask (``flash``, ``sage``) is used for the mask-free forwards and the masked ones fall back to its varlen sibling
when it has one, else to native SDPA.
"""

from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from sage_grpo.config.train import ATTENTION_BACKENDS, MIXED_LENGTH_ATTENTION
from sage_grpo.models.transformer_forward import SplitRows, install_joint_forward, remove_joint_forward

# Backends that take no attention mask, and what runs a masked batch instead.
_MASKED_FALLBACK = {"flash": "flash_varlen", "_flash_3": "_flash_varlen_3", "sage": "sage_varlen",
                    "_native_flash": "native"}


# Backends whose kernels run on CUDA only (torch SDPA's math backend and flex attention also run on the CPU).
CUDA_ONLY_BACKENDS = ("_native_efficient", "_native_flash", "_native_cudnn", "flash", "flash_varlen", "_flash_3",
                      "_flash_varlen_3", "sage", "sage_varlen", "xformers")


def check_attention_backend(name: str, device: Optional[torch.device] = None) -> None:
    """Refuse an unknown backend, one whose package is missing, or a CUDA-only one on another ``device`` (when
    given), naming the alternatives."""
    from diffusers.models.attention_dispatch import _check_attention_backend_requirements, AttentionBackendName

    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    try:
        _check_attention_backend_requirements(AttentionBackendName(name))
    except (RuntimeError, ImportError) as err:
        raise ValueError(f"attention backend {name!r} is not usable here ({err}); 'native' (torch SDPA) always is") \
            from None
    if device is not None and torch.device(device).type != "cuda" and name in CUDA_ONLY_BACKENDS:
        raise ValueError(f"attention backend {name!r} runs on CUDA only, and the device is {device}; use 'native' "
                         "(torch SDPA) there")


def check_attention_runs(name: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse (``ConfigError``) a backend that cannot run on ``device`` in ``dtype``, before any model loads: one
    attention of 8 tokens through the same dispatch as the blocks, with and without a key mask (the masked batches go
    to :data:`_MASKED_FALLBACK`). ``_native_efficient`` and ``_native_cudnn`` pass the package check everywhere but
    have no CPU kernel; without this they would fail at the first forward."""
    from sage_grpo.config.validation import ConfigError

    try:
        check_attention_backend(name)
    except ValueError as err:
        raise ConfigError(f"--attention_backend: {err}") from None
    if device.type == "meta":
        return
    query = torch.zeros(1, 8, 2, 16, dtype=dtype, device=device)
    for mask in (None, torch.ones(1, 1, 1, 8, dtype=torch.bool, device=device)):
        try:
            dispatch(query, query, query, mask, name)
        except (RuntimeError, NotImplementedError, ValueError) as err:
            raise ConfigError(f"[attention-backend] --attention_backend {name} cannot run on {device.type} in "
                              f"{str(dtype).replace('torch.', '')}{' with a key mask' if mask is not None else ''} "
                              f"({str(err).splitlines()[0]}). Fix: --attention_backend native (torch SDPA picks a "
                              "kernel that runs)") from None


def split_rows_of(mode: str, device: torch.device) -> bool:
    """``--mixed_length_attention`` decided for ``device``: split for ``split``, and for ``auto`` on CUDA (the mask
    keeps SDPA off its flash kernel there); the mask for ``mask``, and for ``auto`` elsewhere (the split changes the
    last bits, and the CPU runs are pinned bit for bit)."""
    if mode not in MIXED_LENGTH_ATTENTION:
        raise ValueError(f"unknown mixed-length attention {mode!r}; choose one of {', '.join(MIXED_LENGTH_ATTENTION)}")
    return mode == "split" or (mode == "auto" and torch.device(device).type == "cuda")


def row_runs(lengths: Tuple[int, ...]) -> List[Tuple[int, int, int]]:
    """(first row, end row, valid length) of each run of consecutive rows with the same valid length."""
    runs: List[Tuple[int, int, int]] = []
    for row, length in enumerate(lengths):
        if runs and runs[-1][2] == length:
            runs[-1] = (runs[-1][0], row + 1, length)
        else:
            runs.append((row, row + 1, length))
    return runs


def joint_attention(query: Tensor, key: Tensor, value: Tensor, text_keys: Union[None, Tensor, SplitRows],
                    num_image_tokens: int, backend: Optional[str]) -> Tensor:
    """Attention over [image tokens, text slots], ``(B, N + L, H, D)`` each: mask-free for None; one call under the
    key mask of a ``(B, L)`` text validity; for :class:`SplitRows` one mask-free call per :func:`row_runs` run over
    its own keys (the image tokens and its valid text), the queries all kept."""
    if isinstance(text_keys, SplitRows):
        outs = [dispatch(query[first:end], key[first:end, :num_image_tokens + length],
                         value[first:end, :num_image_tokens + length], None, backend)
                for first, end, length in row_runs(text_keys.lengths)]
        return torch.cat(outs) if len(outs) > 1 else outs[0]
    return dispatch(query, key, value, key_padding_mask(text_keys, num_image_tokens), backend)


def key_padding_mask(text_mask: Optional[Tensor], num_image_tokens: int) -> Optional[Tensor]:
    """(B, 1, 1, N + L) key mask over [image tokens (always valid), text slots], or None for no mask."""
    if text_mask is None:
        return None
    mask = F.pad(text_mask.bool(), (num_image_tokens, 0), value=True)
    return mask[:, None, None, :]


def joint_projections(attn, hidden_states: Tensor, encoder_hidden_states: Tensor,
                      image_rotary_emb: Optional[Tuple[Tensor, Tensor]]) -> Tuple[Tuple[Tensor, ...], ...]:
    """Image (q, k, v) with QK norms and RoPE, and text (q, k, v) with the added QK norms, each (B, n, H, D)."""
    from diffusers.models.embeddings import apply_rotary_emb

    query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1))
                         for proj in (attn.to_q, attn.to_k, attn.to_v))
    query, key = attn.norm_q(query), attn.norm_k(key)
    if image_rotary_emb is not None:
        query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
    text_q, text_k, text_v = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                              for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    if attn.norm_added_q is not None:
        text_q = attn.norm_added_q(text_q)
    if attn.norm_added_k is not None:
        text_k = attn.norm_added_k(text_k)
    return (query, key, value), (text_q, text_k, text_v)


def dispatch(query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor], backend: Optional[str]) -> Tensor:
    """diffusers' attention dispatch on ``backend`` (None: diffusers' active backend), masked batches on a backend
    that takes masks."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    if mask is not None and backend in _MASKED_FALLBACK:
        backend = _MASKED_FALLBACK[backend]
    chosen = AttentionBackendName(backend) if backend is not None else None
    return dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False, backend=chosen,
                                 parallel_config=None)


class JointAttnProcessor:
    """Drop-in for ``HunyuanVideo15AttnProcessor2_0`` taking a trimmed ``(B, L)`` text mask, the rows'
    :class:`SplitRows` or None."""

    def __init__(self, attention_backend: Optional[str] = None):
        self._attention_backend = attention_backend
        self._parallel_config = None

    def __call__(self, attn, hidden_states: Tensor, encoder_hidden_states: Optional[Tensor] = None,
                 attention_mask: Union[None, Tensor, SplitRows] = None,
                 image_rotary_emb: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        if encoder_hidden_states is None:
            raise ValueError("JointAttnProcessor serves HunyuanVideo-1.5 joint attention; text tokens are required")
        (query, key, value), (text_q, text_k, text_v) = joint_projections(attn, hidden_states, encoder_hidden_states,
                                                                          image_rotary_emb)
        num_image_tokens = query.shape[1]
        query, key, value = (torch.cat(pair, dim=1) for pair in ((query, text_q), (key, text_k), (value, text_v)))
        out = joint_attention(query, key, value, attention_mask, num_image_tokens, self._attention_backend)
        out = out.flatten(2, 3).to(query.dtype)
        image_out = attn.to_out[1](attn.to_out[0](out[:, :num_image_tokens]))
        return image_out, attn.to_add_out(out[:, num_image_tokens:])


def install_joint_attention(transformer: torch.nn.Module, backend: Optional[str] = "native",
                            split_rows: bool = False) -> None:
    """:class:`JointAttnProcessor` on ``backend`` on every dual-stream block and the trimming forward, with
    ``split_rows`` (:func:`split_rows_of`) for rows of different valid lengths (idempotent: a second call only
    changes the backend and ``split_rows``)."""
    if backend is not None:
        check_attention_backend(backend)
    for block in transformer.transformer_blocks:
        block.attn.set_processor(JointAttnProcessor(backend))
    install_joint_forward(transformer, split_rows)


def remove_joint_attention(transformer: torch.nn.Module) -> None:
    """Back to diffusers' forward, processor and untrimmed text (for parity tests)."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

    remove_joint_forward(transformer)
    for block in transformer.transformer_blocks:
        block.attn.set_processor(HunyuanVideo15AttnProcessor2_0())

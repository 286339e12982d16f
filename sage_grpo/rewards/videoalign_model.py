"""VideoReward network: transformers' Qwen2-VL with a linear reward head (VideoAlign ``Qwen2VLRewardModelBT``).

``forward`` embeds the tokens, scatters the vision tower's video features into the ``<|video_pad|>`` slots, runs
the language model, applies ``rm_head = Linear(hidden, output_dim, bias=False)`` to every hidden state and pools:

* ``last``: the position before the first pad token (the last real token under right padding);
* ``mean``: the mean over positions ``[0, last)``. Like the reference this leaves out the last real token;
* ``special``: the positions of the three reward tokens in order of appearance, giving ``(B, 3, output_dim)``;
  with ``output_dim == 3`` the diagonal (token k reads head k), otherwise flattened to ``(B, 3 * output_dim)``.

Column 0/1/2 of the pooled logits is VQ/MQ/TA.

Position ids: VideoAlign's forward hands the language model ``inputs_embeds`` without position ids, so the
released checkpoint was trained and is used (transformers 4.45 and 4.57 alike) with plain sequential positions
for every token, not Qwen2-VL's 3-D M-RoPE. ``position_mode="sequential"`` (default) reproduces that;
``"mrope"`` lets transformers compute multimodal positions from ``mm_token_type_ids`` for checkpoints trained
that way.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from transformers import Qwen2VLForConditionalGeneration

PoolingMode = Literal["last", "mean", "special"]
PositionMode = Literal["sequential", "mrope"]


def sequential_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(3, B, L)`` positions 0, 1, 2, ... over the real tokens (pads get 1), as transformers 4.57 builds them
    when no ``input_ids``/grid is passed to Qwen2-VL."""
    positions = attention_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(attention_mask == 0, 1)
    return positions.unsqueeze(0).expand(3, -1, -1)


def pool_reward_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    mode: PoolingMode,
    pad_token_id: int,
    special_token_ids: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Pool per-token head outputs ``(B, L, N)`` into ``(B, K)`` rewards (see module docstring)."""
    batch, length, out_dim = logits.shape
    rows = torch.arange(batch, device=logits.device)
    # First pad position minus one, modulo L: the last real token, or L - 1 for an unpadded row.
    last = (torch.eq(input_ids, pad_token_id).int().argmax(-1) - 1) % length
    if mode == "last":
        return logits[rows, last.to(logits.device)]
    if mode == "mean":
        return torch.stack([logits[i, : int(last[i])].mean(dim=0) for i in range(batch)])
    if mode == "special":
        if not special_token_ids:
            raise ValueError("'special' pooling needs the reward token ids (model_config.use_special_tokens)")
        is_special = torch.zeros_like(input_ids, dtype=torch.bool)
        for token_id in special_token_ids:
            is_special |= input_ids == token_id
        counts = is_special.sum(-1)
        if not bool((counts == 3).all()):
            raise ValueError(
                f"'special' pooling needs exactly 3 reward tokens per sample, found {counts.tolist()}; "
                "use a prompt template that contains them (data_config.prompt_template_type='detailed_special')"
            )
        pooled = logits[is_special.to(logits.device)].view(batch, 3, out_dim)
        if out_dim == 3:
            pooled = pooled.diagonal(dim1=1, dim2=2)
        return pooled.reshape(batch, -1)
    raise ValueError(f"unknown reward pooling {mode!r}; expected 'last', 'mean' or 'special'")


class VideoRewardModel(Qwen2VLForConditionalGeneration):
    """Qwen2-VL backbone + ``rm_head``; ``forward`` returns pooled reward logits ``(B, K)``."""

    def __init__(
        self,
        config,
        output_dim: int = 1,
        reward_token: PoolingMode = "last",
        special_token_ids: tuple[int, ...] | None = None,
        pad_token_id: int | None = None,
        position_mode: PositionMode = "sequential",
    ):
        super().__init__(config)
        self.output_dim = output_dim
        self.rm_head = nn.Linear(config.text_config.hidden_size, output_dim, bias=False)
        self.special_token_ids = tuple(special_token_ids) if special_token_ids is not None else None
        # As in VideoAlign: registering reward tokens switches pooling to them whatever reward_token says.
        self.reward_token = "special" if self.special_token_ids is not None else reward_token
        self.pad_token_id = pad_token_id
        self.position_mode = position_mode

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values_videos: torch.Tensor,
        video_grid_thw: torch.Tensor,
        mm_token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.position_mode == "sequential":
            position_ids = sequential_position_ids(attention_mask)
        elif self.position_mode == "mrope":
            position_ids = None  # transformers derives 3-D positions from mm_token_type_ids + grids
        else:
            raise ValueError(f"unknown position_mode {self.position_mode!r}; expected 'sequential' or 'mrope'")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=video_grid_thw,
            mm_token_type_ids=mm_token_type_ids,
            use_cache=False,
        )
        logits = self.rm_head(outputs.last_hidden_state)  # (B, L, output_dim)
        return pool_reward_logits(
            logits,
            input_ids,
            mode=self.reward_token,
            pad_token_id=self.pad_token_id,
            special_token_ids=self.special_token_ids,
        )

"""HunyuanVideo-1.5's transformer forward without a data-dependent host sync.

diffusers' ``HunyuanVideo15Transformer3DModel.forward`` (0.42.1) reads three things off the device in every call:
``torch.all(image_embeds == 0)`` (text-to-video or not), the valid-first order of each row's text slots (a row:
one sample in one CFG branch), built with boolean-mask indexing (12 index ops per row, each an ``aten::nonzero`` that
waits for the device), and, with our trimmed attention, the batch's longest valid text length. All three depend on the prompt batch
only, never on the latent or the timestep, so :func:`joint_forward` takes them from a :class:`TextLayout` decided on
the host once per prompt batch (the prompt encoder counts the valid tokens when it builds the embeddings;
:func:`sage_grpo.pipeline.velocity.cfg_velocity` adds the image condition and the CFG rows):

* the valid-first order (valid image, byT5, MLLM slots, then the invalid ones in the same order; invalid byT5 and
  MLLM slots zeroed, invalid image slots kept, as diffusers builds it) is a gather along a stable sort of the
  invalid flags, computed on the device;
* the text is cut to the longest valid length before the blocks (the trim explained in ``attention.py``), and the
  key mask is dropped when every row has that length;
* text-to-video is "no image condition" (diffusers' rule is all-zero image embeddings, what the pipelines feed then).

The layout travels in ``attention_kwargs["text_layout"]``: diffusers' own forward accepts and ignores that key, so
the same call runs either forward (the parity tests and ``remove_joint_attention``). Called without a layout,
:func:`joint_forward` counts it from the masks and image embeddings with diffusers' rule (one host sync per forward).
Everything else is diffusers' forward: the same submodules, called in the same order on the same values, so outputs
and gradients are bit-identical to diffusers' forward run with our attention processor and the text trimmed before
the blocks (``tests/unit/test_transformer_forward.py``). Against diffusers' stock forward and processor (the dense
mask over the untrimmed text) they agree to float rounding: on the tiny model the velocity within 1.9e-6 (of ~1.2)
and every gradient within 4.2e-7 (of a largest gradient ~0.49), ``tests/unit/test_attention.py``.

One guard diffusers lacks: a row whose MLLM text has no valid token (an all-zero mask) makes the token refiner pool
0/0 and attend over no key, so that row's text states are NaN. The forward then discards them (invalid slots are
zeroed), but a NaN never leaves the backward (0 x NaN), and every gradient of the refiner became NaN. The refiner
is handed such a row with its first slot marked valid (:func:`refiner_mask`); everywhere else the row stays
all-invalid, so the velocity is diffusers' and the row's gradients are zero, as they truly are.
"""

import types
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

TEXT_LAYOUT_KEY = "text_layout"
SPLIT_ROWS_ATTR = "_split_text_rows"  # set by install_joint_forward: rows of different valid lengths attend apart


@dataclass(frozen=True)
class TextLayout:
    """The host-side facts of one transformer call's text: whether the image tokens are valid slots (image-to-video)
    and each row's number of valid slots (valid image + byT5 + MLLM tokens)."""

    has_image: bool
    valid_lengths: Tuple[int, ...]

    @property
    def length(self) -> int:
        """The longest valid length: what the text is trimmed to."""
        return max(self.valid_lengths)

    @property
    def needs_mask(self) -> bool:
        """Whether some row still has padding after the trim (then the blocks get a key mask)."""
        return min(self.valid_lengths) < self.length

    @classmethod
    def count(cls, image_embeds: Tensor, mask: Tensor, mask_2: Tensor) -> "TextLayout":
        """The layout read off the call's tensors with diffusers' text-to-video rule (all-zero ``image_embeds``):
        one host sync."""
        is_t2v = torch.all(image_embeds == 0).reshape(1).long()
        counts = mask.bool().sum(dim=1) + mask_2.bool().sum(dim=1)
        flag, *lengths = torch.cat([is_t2v, counts.long()]).tolist()
        num_image = 0 if flag else image_embeds.shape[1]
        return cls(not flag, tuple(num_image + n for n in lengths))


@dataclass(frozen=True)
class SplitRows:
    """What the blocks' attention gets instead of a key mask under ``--mixed_length_attention split``: each row's
    number of valid slots after the trim (host ints, from :class:`TextLayout`), so that rows of different lengths
    attend in separate mask-free calls (``sage_grpo.models.attention.joint_attention``)."""

    lengths: Tuple[int, ...]


def valid_first(image: Tensor, image_valid: bool, glyph: Tensor, glyph_mask: Tensor, text: Tensor, text_mask: Tensor,
                length: int) -> Tuple[Tensor, Tensor]:
    """The joint text stream in diffusers' valid-first order, trimmed to ``length`` slots: (B, length, D) states and
    the (B, length) validity of the kept slots. ``image`` (B, N_img, D), ``glyph`` (B, L2, D), ``text`` (B, L, D) with
    (B, L2) and (B, L) masks; the image slots are all valid or all invalid (``image_valid``)."""
    glyph_mask, text_mask = glyph_mask.bool(), text_mask.bool()
    image_mask = torch.full(image.shape[:2], image_valid, dtype=torch.bool, device=image.device)
    valid = torch.cat([image_mask, glyph_mask, text_mask], dim=1)  # (B, S)
    states = torch.cat([image, glyph.where(glyph_mask[..., None], 0.0), text.where(text_mask[..., None], 0.0)], dim=1)
    # stable: within the valid and within the invalid slots the order is [image, byT5, MLLM], as diffusers concatenates
    order = torch.sort(valid.logical_not().to(torch.uint8), dim=1, stable=True).indices[:, :length]  # (B, length)
    return states.gather(1, order[..., None].expand(-1, -1, states.shape[2])), valid.gather(1, order)


def refiner_mask(mask: Tensor) -> Tensor:
    """The MLLM mask (B, L) for the token refiner only: rows without a valid token get their first slot marked valid
    (the refiner's mean pooling and attention are then finite; module docstring); computed on the device."""
    empty = mask.sum(dim=1, keepdim=True) == 0  # (B, 1)
    first = torch.arange(mask.shape[1], device=mask.device) == 0  # (L,)
    return torch.where(empty & first, torch.ones_like(mask), mask)


def joint_forward(self, hidden_states: Tensor, timestep: Tensor, encoder_hidden_states: Tensor,
                  encoder_attention_mask: Tensor, timestep_r: Optional[Tensor] = None,
                  encoder_hidden_states_2: Optional[Tensor] = None, encoder_attention_mask_2: Optional[Tensor] = None,
                  image_embeds: Optional[Tensor] = None, attention_kwargs: Optional[dict] = None,
                  return_dict: bool = True):
    """``HunyuanVideo15Transformer3DModel.forward`` with the text layout from ``attention_kwargs["text_layout"]``
    (module docstring); the arguments and the result are diffusers'."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    layout = (attention_kwargs or {}).get(TEXT_LAYOUT_KEY)
    if layout is None:
        layout = TextLayout.count(image_embeds, encoder_attention_mask, encoder_attention_mask_2)
    batch, _, frames, height, width = hidden_states.shape
    rotary = self.rope(hidden_states)
    temb = self.time_embed(timestep, timestep_r=timestep_r)
    hidden_states = self.x_embedder(hidden_states)

    text = self.context_embedder(encoder_hidden_states, timestep, refiner_mask(encoder_attention_mask))
    text = text + self.cond_type_embed(torch.zeros_like(text[:, :, 0], dtype=torch.long))
    glyph = self.context_embedder_2(encoder_hidden_states_2)
    glyph = glyph + self.cond_type_embed(torch.ones_like(glyph[:, :, 0], dtype=torch.long))
    image = self.image_embedder(image_embeds)
    if not layout.has_image:
        image = image * 0.0  # what diffusers does to text-to-video's (all-zero) image slots
    image = image + self.cond_type_embed(2 * torch.ones_like(image[:, :, 0], dtype=torch.long))

    joint, keep = valid_first(image, layout.has_image, glyph, encoder_attention_mask_2, text, encoder_attention_mask,
                              layout.length)
    mask = None
    if layout.needs_mask:  # rows of different valid lengths: a key mask, or split calls (install_joint_forward)
        mask = SplitRows(layout.valid_lengths) if getattr(self, SPLIT_ROWS_ATTR, False) else keep
    checkpointed = torch.is_grad_enabled() and self.gradient_checkpointing
    for block in self.transformer_blocks:
        if checkpointed:
            hidden_states, joint = self._gradient_checkpointing_func(block, hidden_states, joint, temb, mask, rotary)
        else:
            hidden_states, joint = block(hidden_states, joint, temb, mask, rotary)

    hidden_states = self.proj_out(self.norm_out(hidden_states, temb))
    p_t, p = self.config.patch_size_t, self.config.patch_size
    hidden_states = hidden_states.reshape(batch, frames // p_t, height // p, width // p, -1, p_t, p, p)
    hidden_states = hidden_states.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)
    return Transformer2DModelOutput(sample=hidden_states) if return_dict else (hidden_states,)


def install_joint_forward(transformer: torch.nn.Module, split_rows: bool = False) -> None:
    """Run :func:`joint_forward` as ``transformer``'s forward (an instance attribute, so ``__call__`` and every hook
    on it, FSDP's included, stay as they are), under diffusers' LoRA-scale handling of ``attention_kwargs["scale"]``,
    the decorator of its own forward. ``split_rows``: rows of different valid text lengths reach the blocks'
    attention as :class:`SplitRows` (separate mask-free calls; our processors only) instead of a key mask."""
    from diffusers.utils.peft_utils import apply_lora_scale

    setattr(transformer, SPLIT_ROWS_ATTR, split_rows)
    transformer.forward = types.MethodType(apply_lora_scale("attention_kwargs")(joint_forward), transformer)


def remove_joint_forward(transformer: torch.nn.Module) -> None:
    """Back to the class's (diffusers') forward."""
    transformer.__dict__.pop("forward", None)
    transformer.__dict__.pop(SPLIT_ROWS_ATTR, None)

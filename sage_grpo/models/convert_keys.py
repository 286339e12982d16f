"""The key tables between the reference's (Tencent's) checkpoint names and diffusers', and the renaming in both
directions: :func:`to_diffusers_keys` (conversion, :mod:`sage_grpo.models.convert`) and its inverse
:func:`to_reference_keys` (building a reference-layout checkpoint from a diffusers one, e.g. in tests).

A :class:`KeyRule` maps a reference prefix to one or more diffusers prefixes (several: the reference tensor is their
concatenation along dim 0, e.g. the token refiner's fused qkv) and may swap a tensor's two halves (the final adaLN
projection stores (shift, scale), diffusers' ``norm_out`` (scale, shift)). The tables were written from the
reference's module definitions; the code is our own.
"""

import functools
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

StateDict = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class KeyRule:
    """``reference`` prefix (``{i}``, ``{j}``: block indices) -> ``diffusers`` prefix(es); the rest of a key is kept.

    Several diffusers prefixes: the reference tensor is their concatenation along dim 0 (split when converting).
    ``swap_halves``: the two halves along dim 0 are exchanged (its own inverse).
    """

    reference: str
    diffusers: Tuple[str, ...]
    swap_halves: bool = False


def _rule(reference: str, *diffusers: str, swap_halves: bool = False) -> KeyRule:
    return KeyRule(reference, diffusers, swap_halves)


_REFINER = "txt_in.individual_token_refiner.blocks.{i}."
_DIFFUSERS_REFINER = "context_embedder.token_refiner.refiner_blocks.{i}."
TRANSFORMER_KEYS: Tuple[KeyRule, ...] = (
    _rule("img_in.proj.", "x_embedder.proj."),
    _rule("time_in.mlp.0.", "time_embed.timestep_embedder.linear_1."),
    _rule("time_in.mlp.2.", "time_embed.timestep_embedder.linear_2."),
    # the mean-flow (step-distilled) versions' embedder of the second timestep r
    _rule("time_r_in.mlp.0.", "time_embed.timestep_embedder_r.linear_1."),
    _rule("time_r_in.mlp.2.", "time_embed.timestep_embedder_r.linear_2."),
    _rule("txt_in.t_embedder.mlp.0.", "context_embedder.time_text_embed.timestep_embedder.linear_1."),
    _rule("txt_in.t_embedder.mlp.2.", "context_embedder.time_text_embed.timestep_embedder.linear_2."),
    _rule("txt_in.c_embedder.", "context_embedder.time_text_embed.text_embedder."),
    _rule("txt_in.input_embedder.", "context_embedder.proj_in."),
    _rule(_REFINER + "norm1.", _DIFFUSERS_REFINER + "norm1."),
    _rule(_REFINER + "norm2.", _DIFFUSERS_REFINER + "norm2."),
    _rule(_REFINER + "self_attn_qkv.", *(_DIFFUSERS_REFINER + f"attn.to_{p}." for p in "qkv")),
    _rule(_REFINER + "self_attn_proj.", _DIFFUSERS_REFINER + "attn.to_out.0."),
    _rule(_REFINER + "mlp.fc1.", _DIFFUSERS_REFINER + "ff.net.0.proj."),
    _rule(_REFINER + "mlp.fc2.", _DIFFUSERS_REFINER + "ff.net.2."),
    _rule(_REFINER + "adaLN_modulation.1.", _DIFFUSERS_REFINER + "norm_out.linear."),
    _rule("byt5_in.layernorm.", "context_embedder_2.norm."),
    *(_rule(f"byt5_in.fc{n}.", f"context_embedder_2.linear_{n}.") for n in (1, 2, 3)),
    *(_rule(f"vision_in.proj.{n}.", f"image_embedder.{name}.")
      for n, name in ((0, "norm_in"), (1, "linear_1"), (3, "linear_2"), (4, "norm_out"))),
    _rule("cond_type_embedding.", "cond_type_embed."),
    _rule("double_blocks.{i}.img_mod.linear.", "transformer_blocks.{i}.norm1.linear."),
    _rule("double_blocks.{i}.txt_mod.linear.", "transformer_blocks.{i}.norm1_context.linear."),
    *(_rule(f"double_blocks.{{i}}.img_attn_{p}.", f"transformer_blocks.{{i}}.attn.to_{p}.") for p in "qkv"),
    *(_rule(f"double_blocks.{{i}}.txt_attn_{p}.", f"transformer_blocks.{{i}}.attn.add_{p}_proj.") for p in "qkv"),
    *(_rule(f"double_blocks.{{i}}.img_attn_{p}_norm.", f"transformer_blocks.{{i}}.attn.norm_{p}.") for p in "qk"),
    *(_rule(f"double_blocks.{{i}}.txt_attn_{p}_norm.", f"transformer_blocks.{{i}}.attn.norm_added_{p}.")
      for p in "qk"),
    _rule("double_blocks.{i}.img_attn_proj.", "transformer_blocks.{i}.attn.to_out.0."),
    _rule("double_blocks.{i}.txt_attn_proj.", "transformer_blocks.{i}.attn.to_add_out."),
    _rule("double_blocks.{i}.img_mlp.fc1.", "transformer_blocks.{i}.ff.net.0.proj."),
    _rule("double_blocks.{i}.img_mlp.fc2.", "transformer_blocks.{i}.ff.net.2."),
    _rule("double_blocks.{i}.txt_mlp.fc1.", "transformer_blocks.{i}.ff_context.net.0.proj."),
    _rule("double_blocks.{i}.txt_mlp.fc2.", "transformer_blocks.{i}.ff_context.net.2."),
    _rule("final_layer.adaLN_modulation.1.", "norm_out.linear.", swap_halves=True),
    _rule("final_layer.linear.", "proj_out."),
)

VAE_KEYS: Tuple[KeyRule, ...] = (
    *(_rule(f"{part}.{name}.", f"{part}.{name}.") for part in ("encoder", "decoder")
      for name in ("conv_in", "conv_out", "norm_out")),
    _rule("encoder.down.{i}.block.{j}.", "encoder.down_blocks.{i}.resnets.{j}."),
    _rule("encoder.down.{i}.downsample.", "encoder.down_blocks.{i}.downsamplers.0."),
    _rule("decoder.up.{i}.block.{j}.", "decoder.up_blocks.{i}.resnets.{j}."),
    _rule("decoder.up.{i}.upsample.", "decoder.up_blocks.{i}.upsamplers.0."),
    *(_rule(f"{part}.mid.block_{n}.", f"{part}.mid_block.resnets.{n - 1}.") for part in ("encoder", "decoder")
      for n in (1, 2)),
    *(_rule(f"{part}.mid.attn_1.{old}.", f"{part}.mid_block.attentions.0.{new}.") for part in ("encoder", "decoder")
      for old, new in (("norm", "norm"), ("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("proj_out", "proj_out"))),
)

# Qwen2.5-VL as downloaded -> its language model alone. Both the hub's key naming (``model.layers...``) and the one
# transformers >= 4.52 writes (``model.language_model.layers...``) are accepted; the vision tower and LM head go.
LLM_KEYS: Tuple[KeyRule, ...] = (_rule("model.language_model.", ""), _rule("model.", ""))
LLM_DROPPED = ("visual.", "model.visual.", "lm_head.")
GLYPH_PREFIX = "module.text_tower.encoder."  # Glyph-SDXL-v2's wrapper around byT5's encoder


@functools.lru_cache(maxsize=None)
def _pattern(template: str) -> "re.Pattern[str]":
    escaped = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
    return re.compile(escaped)


def _match(key: str, template: str) -> Optional[Tuple[Dict[str, str], str]]:
    """(block indices, rest of the key) when ``key`` starts with ``template``."""
    found = _pattern(template).match(key)
    return (found.groupdict(), key[found.end():]) if found else None


def _swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_diffusers_keys(state: StateDict, rules: Sequence[KeyRule]) -> Tuple[StateDict, List[str]]:
    """Rename the reference's keys; returns (converted state, reference keys that no rule maps)."""
    converted: StateDict = {}
    unmapped: List[str] = []
    for key, tensor in state.items():
        for rule in rules:
            hit = _match(key, rule.reference)
            if hit is None:
                continue
            indices, rest = hit
            if rule.swap_halves:
                tensor = _swap_halves(tensor)
            parts = tensor.chunk(len(rule.diffusers), dim=0) if len(rule.diffusers) > 1 else (tensor,)
            for prefix, part in zip(rule.diffusers, parts):
                converted[prefix.format(**indices) + rest] = part.contiguous()
            break
        else:
            unmapped.append(key)
    return converted, unmapped


def to_reference_keys(state: StateDict, rules: Sequence[KeyRule]) -> Tuple[StateDict, List[str]]:
    """The inverse of :func:`to_diffusers_keys` (diffusers keys -> the reference's; fused tensors concatenated)."""
    converted: StateDict = {}
    fused: Dict[str, List[Optional[torch.Tensor]]] = {}
    unmapped: List[str] = []
    for key, tensor in state.items():
        for rule in rules:
            hits = [(slot, _match(key, prefix)) for slot, prefix in enumerate(rule.diffusers)]
            hits = [(slot, hit) for slot, hit in hits if hit is not None]
            if not hits:
                continue
            slot, (indices, rest) = hits[0]
            target = rule.reference.format(**indices) + rest
            if len(rule.diffusers) == 1:
                converted[target] = _swap_halves(tensor) if rule.swap_halves else tensor
            else:
                fused.setdefault(target, [None] * len(rule.diffusers))[slot] = tensor
            break
        else:
            unmapped.append(key)
    for target, parts in fused.items():
        if any(part is None for part in parts):
            unmapped.append(f"{target} (only some of its {len(parts)} fused parts)")
            continue
        converted[target] = torch.cat(parts, dim=0)
    return converted, unmapped

"""The inference-speed flags of ``generate.py`` (docs/reference.md#sampling-script-flags), resolved for the device
(:func:`plan_acceleration`) and applied to the loaded transformer (:func:`apply_acceleration`), mapped onto diffusers:

* ``--offloading``: every model lives on the CPU and moves to CUDA for its stage only (text encoders, transformer,
  VAE), as ``enable_model_cpu_offload`` does for a pipeline;
* ``--group_offloading`` (unset: on when the GPU has < 60 GB): ``diffusers.hooks.apply_group_offloading``,
  block level, one block per group, on ``transformer_blocks``; the embedders, token refiner and output layers stay on
  the GPU (the sampler reads its device from them), transfers are synchronous;
* ``--enable_torch_compile``: ``compile_repeated_blocks`` (torch.compile of each repeated block class);
* ``--use_sageattn``: the ``sage_varlen`` attention backend on the blocks of ``--sage_blocks_range`` (the plain
  ``sage`` backend rejects the attention mask HunyuanVideo-1.5 always passes);
* ``--enable_cache``: diffusers' TaylorSeer cache on the blocks' attention (``deepcache``: order 0, reuse;
  ``taylorcache``: order 1), full steps before ``--cache_start_step``, from ``--cache_end_step`` on, every
  ``--cache_step_interval`` and always in the ``--no_cache_block_id`` blocks. ``teacache`` has no diffusers
  counterpart for this transformer (FirstBlockCache does not register its blocks in diffusers 0.42.1).

Offloading, group offloading and SageAttention need CUDA; on another device the plan says so and they are skipped
(SageAttention is an error, as its package is missing on such machines anyway).
"""

import importlib.util
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.dtypes import DTYPES

GROUP_OFFLOAD_BELOW_BYTES = 60 * 1024 ** 3  # reference: group offloading on when the GPU has less than 60 GB
SAGE_BACKEND = "sage_varlen"
CACHE_ORDERS = {"deepcache": 0, "taylorcache": 1}


@dataclass(frozen=True)
class Acceleration:
    """The inference-speed settings that apply on the planned device."""

    model_offload: bool = False
    group_offload: bool = False
    compile_blocks: bool = False
    sage_blocks: Tuple[int, ...] = ()
    cache: Optional[Dict] = None  # diffusers TaylorSeerCacheConfig keyword arguments


def parse_block_ids(text: str, option: str) -> Tuple[int, ...]:
    """``"0-53"`` -> 0..53, ``"1,3"`` -> (1, 3)."""
    try:
        if "-" in text:
            first, last = (int(part) for part in text.split("-", 1))
            ids = tuple(range(first, last + 1))
        else:
            ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        ids = ()
    if not ids or min(ids) < 0:
        raise ValueError(f"{option} {text!r}: use a block range such as 0-53 or a list such as 1,3,5")
    return ids


def _cache_settings(config: GenerateConfig) -> Dict:
    if config.cache_type not in CACHE_ORDERS:
        raise ValueError(f"--cache_type {config.cache_type}: not available for HunyuanVideo-1.5 in diffusers "
                         f"(FirstBlockCache does not register its blocks); use one of {sorted(CACHE_ORDERS)}")
    start, end = config.cache_start_step, config.cache_end_step
    if config.cache_step_interval < 1 or start < 0 or end <= start:
        raise ValueError("--enable_cache needs --cache_step_interval >= 1 and 0 <= --cache_start_step < "
                         f"--cache_end_step, got {config.cache_step_interval}, {start}, {end}")
    full = "|".join(str(i) for i in parse_block_ids(config.no_cache_block_id, "--no_cache_block_id"))
    return dict(cache_interval=config.cache_step_interval, disable_cache_before_step=start,
                disable_cache_after_step=end, max_order=CACHE_ORDERS[config.cache_type],
                taylor_factors_dtype=DTYPES[config.dtype],
                cache_identifiers=[rf"transformer_blocks\.(?!(?:{full})\.)\d+\.attn"])


def plan_acceleration(config: GenerateConfig, device: torch.device) -> Tuple[Acceleration, List[str]]:
    """Resolve the speed flags for ``device``; errors for impossible requests, notes for what is skipped."""
    notes: List[str] = []
    cuda = device.type == "cuda"
    if config.use_sageattn:
        if config.sparse_attn:
            raise ValueError("--use_sageattn and --sparse_attn cannot be combined (as in the reference)")
        if importlib.util.find_spec("sageattention") is None or not cuda:
            raise ValueError("--use_sageattn needs CUDA and the sageattention package (pip install sageattention); "
                             f"the device is {device} and the package is "
                             f"{'present' if importlib.util.find_spec('sageattention') else 'missing'}")
        if config.dtype != "bf16":
            raise ValueError("--use_sageattn runs in bf16 or fp16 only; add --dtype bf16")
    sage_blocks = parse_block_ids(config.sage_blocks_range, "--sage_blocks_range") if config.use_sageattn else ()
    cache = _cache_settings(config) if config.enable_cache else None
    group = config.group_offloading
    if group is None:
        group = cuda and torch.cuda.get_device_properties(device).total_memory < GROUP_OFFLOAD_BELOW_BYTES
    for flag, wanted in (("--offloading", config.offloading), ("--group_offloading", group)):
        if wanted and not cuda:
            notes.append(f"{flag} is skipped on {device}: it moves weights between the CPU and a CUDA device")
    return Acceleration(model_offload=config.offloading and cuda, group_offload=bool(group) and cuda,
                        compile_blocks=config.enable_torch_compile, sage_blocks=sage_blocks, cache=cache), notes


def offload_transformer_blocks(transformer: torch.nn.Module, device: torch.device) -> None:
    """Group offloading of ``transformer_blocks`` (one block per group, weights on the CPU between uses); the
    other modules move to ``device`` and stay there."""
    from diffusers.hooks import apply_group_offloading

    for name, child in transformer.named_children():
        if name != "transformer_blocks":
            child.to(device)
    holder = torch.nn.Module()  # the hooks go on the blocks themselves; the holder only scopes the traversal
    holder.transformer_blocks = transformer.transformer_blocks
    apply_group_offloading(holder, onload_device=device, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1)


def apply_acceleration(transformer: torch.nn.Module, acceleration: Acceleration, device: torch.device) -> None:
    """Attention backend, feature cache, group offloading, then compilation (compiled code sees the final model)."""
    for index in acceleration.sage_blocks:
        if index < len(transformer.transformer_blocks):
            transformer.transformer_blocks[index].attn.set_attention_backend(SAGE_BACKEND)
    if acceleration.cache is not None:
        from diffusers import TaylorSeerCacheConfig

        transformer.enable_cache(TaylorSeerCacheConfig(**acceleration.cache))
    if acceleration.group_offload:
        offload_transformer_blocks(transformer, device)
    if acceleration.compile_blocks:
        transformer.compile_repeated_blocks(fullgraph=False)

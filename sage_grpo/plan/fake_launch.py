"""The launch the simulation (:mod:`sage_grpo.plan.simulate`) runs, built without a GPU: a ``fake`` process group of
``--world_size`` ranks, the policy, the KL reference and the drift proxy's base copy on the ``meta`` device with the
trainer's joint attention, Ulysses SP, FSDP2 and checkpointing, and the step's prompt conditioning.
"""

import contextlib
from typing import Dict

import torch
import torch.distributed as dist

from sage_grpo import rl
from sage_grpo.config import ConfigError
from sage_grpo.config.train import ThroughputConfig
from sage_grpo.distributed.fsdp import apply_fsdp
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.parallelize import policy_param_dtype, shard_frozen
from sage_grpo.distributed.sequence_parallel import apply_sequence_parallel
from sage_grpo.dtypes import DTYPES
from sage_grpo.models.attention import install_joint_attention, split_rows_of
from sage_grpo.models.bundle import build_lora
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.sizes import TextTokens

NEGATIVE_VALID_TOKENS = 8  # valid text slots of the empty negative prompt (the MLLM template), the split CFG row's


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """This process as ``rank`` of a ``fake`` process group of ``world_size`` (collectives return at once)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's testing helper, only when simulating

    if dist.is_initialized():
        raise RuntimeError("the simulation needs its own (fake) process group; one is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def public_config(config: Dict) -> Dict:
    """``config`` without diffusers' bookkeeping keys: ``_use_default_values`` would restore the defaults of the keys
    it names (``num_layers`` among them) over the values given."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _transformer_on_meta(config: Dict, dtype: torch.dtype, attention_backend: str, split_rows: bool):
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel.from_config(public_config(config)).to(dtype)
    # and the sync-free forward (models/transformer_forward.py), splitting rows as on CUDA
    install_joint_attention(model, attention_backend, split_rows)
    return model


def split_rows_on_cuda(throughput: ThroughputConfig) -> bool:
    """``--mixed_length_attention`` as a CUDA run decides it (the simulated launch's device)."""
    return split_rows_of(throughput.mixed_length_attention, torch.device("cuda"))


def build_sharded(cfg: PlanOptions, world_size: int, config: Dict, placement):
    """(policy, reference, dims, lora, base) parallelized as ``parallelize_models`` does, still on ``meta``: the
    reference is None without one, ``base`` (the drift proxy's frozen copy) where the run holds none; with
    ``--use_lora`` the reference is None too and ``lora`` the trainer's
    :class:`~sage_grpo.models.lora.LoraTraining` on the policy (the frozen base in ``--dtype``, the adapters in
    ``--master_weight_type``, the KL anchor a second adapter), built by the trainer's own
    :func:`~sage_grpo.models.bundle.build_lora`."""
    if not (cfg.parallel.enable_fsdp and world_size > 1):
        raise ConfigError("--simulate covers FSDP2 launches on several ranks (torch's FSDP memory tracker), full "
                          "fine-tuning or --use_lora; this launch is planned only: pass --enable_fsdp and "
                          "--world_size > 1")
    dims = ParallelDims(world_size=world_size, sp_size=cfg.parallel.sp_size, dp_replicate=cfg.parallel.dp_replicate,
                        batch_size=cfg.data.batch_size, num_generations=cfg.data.num_generations,
                        num_attention_heads=config.get("num_attention_heads", 16))
    dims.build_meshes()
    kl_mode = rl.kl_mode_of(cfg.trust_region)
    split_rows = split_rows_on_cuda(cfg.throughput)

    def on_meta(dtype_name: str):
        return _transformer_on_meta(config, DTYPES[dtype_name], cfg.model.attention_backend, split_rows)

    lora = reference = base = None
    if cfg.lora.use_lora:  # as build_models: the base loaded in --dtype, frozen, the adapters in the master dtype
        policy = on_meta(cfg.model.dtype)
        lora = build_lora(cfg, kl_mode, policy, DTYPES[cfg.model.master_weight_type])
    else:
        policy = on_meta(cfg.model.master_weight_type)
        policy.requires_grad_(True)
        base_copy = rl.drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora,
                                      kl_mode).base_copy
        reference, base = [on_meta(cfg.model.dtype).requires_grad_(False).eval() if wanted else None
                           for wanted in (kl_mode.uses_reference, base_copy)]
    policy.train()
    for model in (policy, reference, base):
        if model is not None:
            apply_sequence_parallel(model, dims.sp_group)
    apply_fsdp(policy, dims.fsdp_mesh, param_dtype=policy_param_dtype(cfg), reduce_dtype=torch.float32,
               activation_checkpointing=cfg.parallel.enable_gradient_checkpointing)
    for model in (reference, base):  # offloaded shards are left on the device here and out of its tally (docstring)
        if model is not None:
            shard_frozen(model, dims.fsdp_mesh, offload=False)
    return policy, reference, dims, lora, base


def fake_embeds(text: TextTokens, split_negative: bool, batch: int, config: Dict, dtype: torch.dtype) -> PromptEmbeds:
    """Fake prompt conditioning of ``batch`` prompts: every MLLM and byT5 slot valid (the planner's worst case); with
    the CFG rows split (``split_negative``: ``--mixed_length_attention`` with CFG) the negative prompt has
    :data:`NEGATIVE_VALID_TOKENS` valid slots, so the blocks run the split calls (masked calls would run SDPA's math
    kernel on the CPU, which a GPU's masked kernels do not: the simulation keeps equal lengths, and no mask, then)."""
    def stream(length: int, width: int):
        return (torch.zeros(batch, length, width, dtype=dtype), torch.ones(batch, length, dtype=torch.int64))

    (mllm, mask), (glyph, glyph_mask) = stream(text.mllm, config["text_embed_dim"]), stream(text.byt5,
                                                                                           config["text_embed_2_dim"])
    negative = NEGATIVE_VALID_TOKENS if split_negative else text.total
    counted = ((text.total, negative),) * batch  # what the forward reads, on the host
    return PromptEmbeds(mllm, mask, glyph, glyph_mask, mllm.clone(), mask.clone(), glyph.clone(), glyph_mask.clone(),
                        valid_tokens=counted)

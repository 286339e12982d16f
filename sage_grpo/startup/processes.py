"""The processes of a run: join the torchrun job (if any) and check the configuration and the parallel layout
(docs/reference.md#layout-rules) before any model loads, so a bad launch ends in one line on every rank."""

from typing import List, Tuple

import torch

from sage_grpo.config import validate_train_config
from sage_grpo.config.validation import TrainSections
from sage_grpo.distributed.liveness import PeerWatch, collective_timeout
from sage_grpo.distributed.parallel_dims import ParallelDims, init_distributed
from sage_grpo.models.geometry import read_model_geometry


def start_processes(cfg: TrainSections, device: torch.device) -> Tuple[ParallelDims, PeerWatch, List[str]]:
    """Join the torchrun job (if any) for this process's ``device``, check the configuration and the parallel layout
    (docs/reference.md#layout-rules; the transformer's heads and every video's tokens, from the model's config files)
    before any model loads. Returns the layout, the peers' watch and the configuration's notes."""
    timeout = collective_timeout(cfg.parallel.collective_timeout_minutes)  # a ConfigError before the job is joined
    env = init_distributed(backend="gloo" if device.type == "cpu" else None, timeout=timeout)
    geometry = read_model_geometry(cfg)
    heads = geometry.num_attention_heads if geometry is not None else None
    notes = validate_train_config(cfg, world_size=env.world_size, num_attention_heads=heads)
    dims = ParallelDims(world_size=env.world_size, sp_size=cfg.parallel.sp_size,
                        dp_replicate=cfg.parallel.dp_replicate, rank=env.rank, device=device,
                        batch_size=cfg.data.batch_size, num_generations=cfg.data.num_generations,
                        num_attention_heads=heads)
    for tokens in (geometry.video_tokens.values() if geometry is not None else ()):
        dims.check_tokens(tokens)
    return dims, PeerWatch(timeout), notes

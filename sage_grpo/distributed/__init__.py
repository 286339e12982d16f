"""Parallelism applied from outside the model: process layout and meshes, Ulysses sequence parallelism, FSDP2,
and the few collectives the trainer needs. Model code knows nothing about any of it."""

from sage_grpo.distributed.collectives import (all_gather_in_group, all_gather_world, average_gradients, barrier,
                                               broadcast_from_sp_leader, broadcast_object_from_sp_leader,
                                               mean_over_world, mean_tensor_over_world)
from sage_grpo.distributed.fsdp import GradientReductionCounter, apply_fsdp, gradient_sync
from sage_grpo.distributed.parallel_dims import DistributedEnv, ParallelDims, destroy_distributed, init_distributed
from sage_grpo.distributed.sequence_parallel import apply_sequence_parallel, remove_sequence_parallel

__all__ = [
    "DistributedEnv", "GradientReductionCounter", "ParallelDims", "all_gather_in_group",
    "all_gather_world", "apply_fsdp", "apply_sequence_parallel", "average_gradients", "barrier",
    "broadcast_from_sp_leader", "broadcast_object_from_sp_leader", "destroy_distributed", "gradient_sync",
    "init_distributed", "mean_over_world", "mean_tensor_over_world", "remove_sequence_parallel",
]

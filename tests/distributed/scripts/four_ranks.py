"""4-process checks (torchrun --nproc_per_node 4): the (dp 2, sp 2) layout and its collectives, Ulysses sp=4, and
FSDP2 over the flattened dp x sp mesh and HSDP combined with SP, and Muon on HSDP shards, against one process.

    torchrun --nproc_per_node 4 tests/distributed/scripts/four_ranks.py report.json
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor

from common import (Report, build_transformer, check_sp_matches_unsplit, forward, grad_pairs, loss_of, make_inputs,
                    max_abs_diff, max_param_diff, param_pairs)
from sage_grpo.distributed import (ParallelDims, all_gather_in_group, all_gather_world, apply_fsdp,
                                   apply_sequence_parallel, broadcast_from_sp_leader, broadcast_object_from_sp_leader,
                                   init_distributed, mean_over_world)
from sage_grpo.optim.muon import Muon


def gathered(values) -> list:
    """Every rank's ``values`` (a list of ints), in rank order."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, values)
    return out


def check_layout_and_collectives(report: Report, dims: ParallelDims) -> None:
    report.put("layout", gathered([dims.dp_rank, dims.sp_rank, dims.is_sp_leader, dims.sp_leader_rank]))
    report.put("sp_groups", gathered(dist.get_process_group_ranks(dims.sp_group)))
    report.put("dp_groups", gathered(dist.get_process_group_ranks(dims.dp_group)))
    report.put("prompt_groups", gathered(dist.get_process_group_ranks(dims.prompt_group)))
    report.put("fsdp_mesh_shape", list(dims.fsdp_mesh.shape))
    rank = dims.rank
    report.put("sp_broadcast", gathered(int(broadcast_from_sp_leader(torch.tensor([rank]), dims).item())))
    report.put("sp_broadcast_object", gathered(broadcast_object_from_sp_leader({"from": rank}, dims)["from"]))
    # Rewards of a prompt group (G = 2 over B = 1 per rank): each DP rank's reward, broadcast in its SP group first.
    reward = broadcast_from_sp_leader(torch.tensor([10.0 * dims.dp_rank + rank]), dims)
    report.put("group_rewards", gathered(all_gather_in_group(reward, dims.prompt_group).tolist()))
    report.put("world_gather", gathered(all_gather_world(torch.tensor([rank])).tolist()))
    report.put("metric_mean", gathered(mean_over_world({"loss": float(rank), "kl": 2.0 * rank}, dims.device)))

    hsdp = ParallelDims(world_size=4, sp_size=2, dp_replicate=2, rank=rank)
    hsdp.build_meshes()
    report.put("hsdp_mesh", [list(hsdp.fsdp_mesh.shape), list(hsdp.fsdp_mesh.mesh_dim_names)])


def check_fsdp_with_sp(report: Report, dims: ParallelDims, name: str, steps: int) -> None:
    """Replica d (an SP group) trains on sample d; the reference on the mean loss over replicas. FSDP's mean over
    every rank of the mesh is both the DP average and the SP gradient correction."""
    ref = build_transformer()
    model = build_transformer()
    apply_sequence_parallel(model, dims.sp_group)
    apply_fsdp(model, dims.fsdp_mesh, param_dtype=torch.float32, activation_checkpointing=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    samples = [make_inputs(seed=20 + d) for d in range(dims.dp_size)]
    for step in range(steps):
        out = forward(model, samples[dims.dp_rank])
        loss_of(out).backward()
        ref_outs = [forward(ref, s) for s in samples]
        (sum(loss_of(o) for o in ref_outs) / len(ref_outs)).backward()
        report.worst(f"{name}_output_err_step{step}", max_abs_diff(out, ref_outs[dims.dp_rank]))
        if step == 0:
            report.worst(f"{name}_grad_err", max_param_diff(grad_pairs(model, ref)))
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    report.worst(f"{name}_param_err", max_param_diff(param_pairs(model, ref)))


def check_muon_on_hsdp(report: Report, dims: ParallelDims) -> None:
    """Muon on (Replicate, Shard(0)) parameters, fed the single-process gradients: bit-identical to Muon on one process."""
    ref = build_transformer()
    model = apply_fsdp(build_transformer(), dims.fsdp_mesh, param_dtype=torch.float32, activation_checkpointing=False)

    def matrices(m):
        return [p for n, p in m.named_parameters() if p.ndim == 2 and n.startswith("transformer_blocks")]

    hyper = dict(lr=1e-2, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    opt, ref_opt = Muon(matrices(model), **hyper), Muon(matrices(ref), **hyper)
    for step in range(2):
        loss_of(forward(ref, make_inputs(seed=30 + step))).backward()
        for p, q in zip(matrices(model), matrices(ref)):
            if q.grad is not None:
                p.grad = distribute_tensor(q.grad, p.device_mesh, p.placements, src_data_rank=None)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    report.put("hsdp_muon_placements", [str(pl) for pl in matrices(model)[0].placements])
    report.worst("hsdp_muon_param_err", max_param_diff(zip(matrices(model), matrices(ref))))


def main() -> None:
    env = init_distributed()
    torch.set_num_threads(1)
    report = Report(sys.argv[1])
    dims = ParallelDims.from_env(env, sp_size=2, batch_size=1, num_generations=2, num_attention_heads=4)
    dims.build_meshes()
    check_layout_and_collectives(report, dims)
    check_sp_matches_unsplit(report, env, 4)
    check_fsdp_with_sp(report, dims, "fsdp_dp2_sp2", steps=2)
    hsdp = ParallelDims.from_env(env, sp_size=2, dp_replicate=2)
    hsdp.build_meshes()
    check_fsdp_with_sp(report, hsdp, "hsdp_dp2_sp2", steps=2)
    check_muon_on_hsdp(report, hsdp)
    report.write()


if __name__ == "__main__":
    main()

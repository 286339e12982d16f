"""2-process checks (torchrun --nproc_per_node 2): Ulysses sp=2, FSDP2 vs one process, accumulation, FSDP Muon.

    torchrun --nproc_per_node 2 tests/distributed/scripts/two_ranks.py report.json
"""

import copy
import sys

import torch

from common import (Report, build_transformer, check_sp_matches_unsplit, forward, grad_pairs, loss_of, make_inputs,
                    max_abs_diff, max_param_diff, param_pairs)
from sage_grpo.config.validation import ConfigError
from sage_grpo.distributed import (GradientReductionCounter, ParallelDims, apply_fsdp, average_gradients,
                                   gradient_sync, init_distributed, remove_sequence_parallel)
from sage_grpo.optim.muon import Muon


def check_sequence_parallel(report: Report, env) -> None:
    model, ref, inputs, ref_out, dims = check_sp_matches_unsplit(report, env, 2)
    model.zero_grad(set_to_none=True)
    model.enable_gradient_checkpointing()
    out = forward(model, inputs)
    loss_of(out).backward()
    average_gradients(model.parameters(), dims.sp_group)
    report.worst("sp2_ckpt_output_err", max_abs_diff(out, ref_out))
    report.worst("sp2_ckpt_grad_err", max_param_diff(grad_pairs(model, ref)))
    model.disable_gradient_checkpointing()

    with torch.no_grad():
        try:
            forward(model, make_inputs(seed=0, frames=1, height=3, width=3))  # 9 tokens over 2 ranks
            report.put("sp2_odd_tokens_error", None)
        except ConfigError as err:
            report.put("sp2_odd_tokens_error", str(err))
        remove_sequence_parallel(model)
        report.worst("sp2_removed_output_err", max_abs_diff(forward(model, inputs), ref_out))
    report.put("sp2_removed_processors", sorted({type(b.attn.processor).__name__ for b in model.transformer_blocks}))


def check_fsdp(report: Report, env) -> None:
    """3 AdamW steps; rank r trains on sample r, the reference on the mean loss of both samples."""
    dims = ParallelDims.from_env(env, sp_size=1)
    dims.build_meshes()
    ref = build_transformer()
    model = apply_fsdp(build_transformer(), dims.fsdp_mesh, param_dtype=torch.float32, activation_checkpointing=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    samples = [make_inputs(seed=10 + r) for r in range(env.world_size)]
    for step in range(3):
        out = forward(model, samples[env.rank])
        loss_of(out).backward()
        ref_outs = [forward(ref, s) for s in samples]
        (sum(loss_of(o) for o in ref_outs) / len(ref_outs)).backward()
        report.worst(f"fsdp_output_err_step{step}", max_abs_diff(out, ref_outs[env.rank]))
        if step == 0:
            report.worst("fsdp_grad_err", max_param_diff(grad_pairs(model, ref)))
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    report.worst("fsdp_param_err_after_3_steps", max_param_diff(param_pairs(model, ref)))
    report.put("fsdp_local_numel_fraction",
               sum(p.to_local().numel() for p in model.parameters()) / sum(p.numel() for p in ref.parameters()))


def check_accumulation(report: Report, env) -> None:
    """2 updates x 3 micro-steps, reduce-scatter only on the last micro-step; then the reference cadence for 1 update."""
    dims = ParallelDims.from_env(env, sp_size=1)
    dims.build_meshes()
    ref = build_transformer()
    model = apply_fsdp(build_transformer(), dims.fsdp_mesh, param_dtype=torch.float32, activation_checkpointing=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    micro_steps, updates = 3, 2
    with GradientReductionCounter(model) as counter:
        for update in range(updates):
            for micro in range(micro_steps):
                samples = [make_inputs(seed=100 * update + 10 * micro + r) for r in range(env.world_size)]
                with gradient_sync(model, enabled=micro == micro_steps - 1):
                    (loss_of(forward(model, samples[env.rank])) / micro_steps).backward()
                ref_loss = sum(loss_of(forward(ref, s)) for s in samples) / len(samples)
                (ref_loss / micro_steps).backward()
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad(set_to_none=True)
    report.put("accum_reductions_per_unit", sorted(set(counter.calls.values())))
    report.put("accum_updates_reduced", counter.updates_reduced)
    report.put("accum_num_units", len(counter.calls))
    report.worst("accum_param_err", max_param_diff(param_pairs(model, ref)))
    with GradientReductionCounter(model) as counter:  # the reference: reduce on every micro-step
        for micro in range(micro_steps):
            (loss_of(forward(model, make_inputs(seed=micro + env.rank))) / micro_steps).backward()
        opt.step()
    report.put("every_step_reductions_per_unit", sorted(set(counter.calls.values())))


def check_muon(report: Report, env) -> None:
    """Muon on 2 ranks' shards vs Muon on one process, 2 steps each (momentum included).

    (a) Given the very same gradient the sharded step must be bit-identical. (b) End to end (same data on both ranks,
    real FSDP backward): FSDP's gradients differ from one process's by ~1e-9; the CPU's fp32 Newton-Schulz keeps that
    at float rounding (the GPU's bf16 iteration can flip a rounding and amplify it to ~1e-4 of the update size).
    """
    from torch.distributed.tensor import distribute_tensor

    dims = ParallelDims.from_env(env, sp_size=1)
    dims.build_meshes()

    # Every matrix except the 2048-wide byT5 projection (its Newton-Schulz is slow on CPU and adds nothing here).
    def matrices(m):
        return [p for n, p in m.named_parameters() if p.ndim == 2 and not n.startswith("context_embedder_2")]

    hyper = dict(lr=1e-3, weight_decay=0.01, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
    inputs = make_inputs(seed=7)
    for mode in ("same_grads", "end_to_end"):
        ref = build_transformer()
        model = apply_fsdp(build_transformer(), dims.fsdp_mesh, param_dtype=torch.float32,
                           activation_checkpointing=False)
        opt, ref_opt = Muon(matrices(model), **hyper), Muon(matrices(ref), **hyper)
        initial = copy.deepcopy(ref)
        for _ in range(2):
            loss_of(forward(ref, inputs)).backward()
            if mode == "same_grads":
                for p, q in zip(matrices(model), matrices(ref)):
                    if q.grad is not None:
                        p.grad = distribute_tensor(q.grad, p.device_mesh, p.placements, src_data_rank=None)
            else:
                loss_of(forward(model, inputs)).backward()
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad(set_to_none=True)
        report.worst(f"muon_{mode}_param_err", max_param_diff(zip(matrices(model), matrices(ref))))
    moved = [max_abs_diff(p, q) > 0 for p, q in zip(matrices(ref), matrices(initial))]
    report.put("muon_matrices_updated", [sum(moved), len(moved)])
    report.put("muon_shapes", sorted({tuple(p.shape) for p in matrices(ref)}))
    report.put("muon_uneven_shards", any(p.shape[0] % env.world_size for p in matrices(ref)))


def main() -> None:
    env = init_distributed()
    torch.set_num_threads(1)
    report = Report(sys.argv[1])
    for check in (check_sequence_parallel, check_fsdp, check_accumulation, check_muon):
        check(report, env)
    report.write()


if __name__ == "__main__":
    main()

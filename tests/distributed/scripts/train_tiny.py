"""Run the GRPO trainer on the tiny checkpoint (under torchrun, or as one process) and report what the tests check.

    torchrun --nproc_per_node 4 tests/distributed/scripts/train_tiny.py --report_dir DIR [--previous_report_dir DIR] \\
        <post_train.py flags>

Writes, from rank 0, ``DIR/report.json``:

- the layout (world, dp, sp) and the trainer's counters;
- FSDP reduce-scatters per FSDP unit (``GradientReductionCounter``), the number of backward passes and of those
  run with gradient synchronisation, to check one gradient reduction per optimizer update;
- per optimizer update, the norm of the full gradient at which it was clipped and its norm after clipping
  (``clip_thresholds``, ``clipped_grad_norms``);
- with ``--resume_from_checkpoint``: the largest difference between the weights (and the moving anchor, and the EMA
  of ``--ema_decay``) right after the resume and those the checkpointed run had (its
  ``checkpoint-N/transformer/model.safetensors``, the ``anchor.pt`` its report dir holds, ``checkpoint-N/ema/``);
- with ``--ema_decay``: whether every EMA tensor is sharded like its weight (same mesh and placements, DTensors
  exactly when the weights are);

and ``DIR/anchor.pt``: the full reference (anchor) weights at the end of the run.
"""

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from safetensors.torch import load_file  # noqa: E402

from sage_grpo.checkpoint import gather_to_main, resolve_resume_path  # noqa: E402
from sage_grpo.config import parse_cli  # noqa: E402
from sage_grpo.config.train import TrainConfig  # noqa: E402
from sage_grpo.distributed import GradientReductionCounter, barrier, destroy_distributed  # noqa: E402
from sage_grpo.distributed.parallelize import is_sharded  # noqa: E402
import sage_grpo.pipeline.policy_update as policy_update_module  # noqa: E402
import sage_grpo.trainer as trainer_module  # noqa: E402
from sage_grpo.startup.plan import ResumeDecision  # noqa: E402
from sage_grpo.trainer import GRPOTrainer  # noqa: E402


def trained_and_anchor(trainer: GRPOTrainer) -> tuple:
    """Full trainable weights and full anchor weights, as the checkpoints key them, on rank 0 (a collective)."""
    models = trainer.models
    anchor = models.reference_state() if models.reference is not None else {}
    return (gather_to_main(models.trainable_state_dict(), trainer.is_main), gather_to_main(anchor, trainer.is_main))


def max_difference(state: dict, expected: dict) -> float:
    assert set(expected) == set(state), sorted(set(expected) ^ set(state))[:5]
    return max((state[k].float() - expected[k].float()).abs().max().item() for k in expected)


def record_gradient_sync() -> list:
    """Wrap the policy pass's ``gradient_sync``: one entry (the ``enabled`` flag) per policy backward pass."""
    flags = []
    original = policy_update_module.gradient_sync

    def recording(model, enabled):
        flags.append(bool(enabled))
        return original(model, enabled)

    policy_update_module.gradient_sync = recording
    return flags


def record_clipping() -> dict:
    """Wrap the trainer's ``clip_gradients``: per optimizer update the threshold it was given and the global norm of
    the gradients after clipping."""
    clips = {"clip_thresholds": [], "clipped_grad_norms": []}
    original = trainer_module.clip_gradients

    def recording(params, max_norm):
        norm = original(params, max_norm)
        after = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        clips["clip_thresholds"].append(float(max_norm))
        clips["clipped_grad_norms"].append(float(after.full_tensor() if hasattr(after, "full_tensor") else after))
        return norm

    trainer_module.clip_gradients = recording
    return clips


def resume_errors(trainer: GRPOTrainer, previous: Path) -> dict:
    """Resume now (instead of inside ``train``) and compare the restored weights with the checkpointed run's."""
    path = resolve_resume_path(trainer.cfg.output.resume_from_checkpoint, trainer.run_dir)
    trainer.resume(path)
    trainer.plan = dataclasses.replace(trainer.plan, resume=ResumeDecision(None, False))  # train() resumes no more
    policy, anchor = trained_and_anchor(trainer)
    ema = gather_to_main(trainer.ema.state_dict(), trainer.is_main) if trainer.ema is not None else None
    if not trainer.is_main:
        return {}
    errors = {"resumed_from_step": trainer.global_step,
              "resume_weight_err": max_difference(policy, load_file(path / "transformer" / "model.safetensors")),
              "resume_anchor_err": max_difference(anchor, torch.load(previous / "anchor.pt"))}
    if ema is not None:
        errors["resume_ema_err"] = max_difference(ema, load_file(path / "ema" / "model.safetensors"))
    return errors


def ema_sharded_like_the_weights(trainer: GRPOTrainer) -> bool:
    weights, average = trainer.models.trainable_state_dict(), trainer.ema.state_dict()
    return all(isinstance(average[n], DTensor) == isinstance(w, DTensor) and (
        not isinstance(w, DTensor) or (average[n].placements == w.placements and average[n].device_mesh == w.device_mesh
                                       and average[n].to_local().shape == w.to_local().shape))
        for n, w in weights.items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report_dir", required=True)
    parser.add_argument("--previous_report_dir")
    args, trainer_flags = parser.parse_known_args()
    torch.set_num_threads(1)
    trainer = GRPOTrainer(parse_cli(TrainConfig, trainer_flags))
    report = {"world_size": trainer.dims.world_size, "dp_size": trainer.dp_size, "sp_size": trainer.dims.sp_size,
              "policy_sharded": is_sharded(trainer.models.policy),
              "reference_sharded": is_sharded(trainer.models.reference)}
    if args.previous_report_dir:
        report.update(resume_errors(trainer, Path(args.previous_report_dir)))
    compute_dtypes = set()  # dtype of the first block's weights inside its forward (FSDP: the all-gathered ones)
    trainer.models.policy.transformer_blocks[0].register_forward_pre_hook(
        lambda block, args: compute_dtypes.add(str(next(block.parameters()).dtype)))
    sync_flags = record_gradient_sync()
    clips = record_clipping()
    sharded = is_sharded(trainer.models.policy)
    with GradientReductionCounter(trainer.models.policy) if sharded else contextlib.nullcontext() as counter:
        trainer.train()
    _, anchor = trained_and_anchor(trainer)
    report.update(update_steps=trainer.update_steps, global_step=trainer.global_step, backward_passes=len(sync_flags),
                  synced_backward_passes=sum(sync_flags),
                  reductions_per_unit=sorted(set(counter.calls.values())) if sharded else None,
                  updates_reduced=counter.updates_reduced if sharded else None,
                  compute_dtypes=sorted(compute_dtypes), **clips,
                  ema_sharded_like_the_weights=ema_sharded_like_the_weights(trainer) if trainer.ema else None,
                  run_dir=str(trainer.run_dir))
    if trainer.is_main:
        report_dir = Path(args.report_dir)
        report_dir.mkdir(parents=True, exist_ok=True)
        torch.save(anchor, report_dir / "anchor.pt")
        (report_dir / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    barrier(trainer.dims.device)
    destroy_distributed()


if __name__ == "__main__":
    main()

"""The simulated GRPO step against the plan at reduced depth (issue 27): 2 dual-stream blocks at the real width,
world 4, sp 2, fake tensors over a fake process group (sage_grpo/plan/simulate.py)."""
import dataclasses

import pytest

from sage_grpo.config import TrainConfig, parse_cli
from sage_grpo.plan.simulate import GIB, planner_groups, simulation_report

TOLERANCE = 0.05
FLAGS = ["--pretrained_model_root", "/nonexistent", "--batch_size", "2", "--num_generations", "4", "--enable_fsdp",
         "--enable_gradient_checkpointing", "--sp_size", "2", "--kl_weight", "1e-5", "--use_moving_KL", "True",
         "--use_dual_kl", "True", "--validation_interval", "0", "--sample_n_frames", "9", "--rollout_height", "128",
         "--rollout_width", "128", "--gradient_reduction", "per_backward"]


@pytest.fixture(scope="module")
def simulated():
    from sage_grpo.plan import memory as planner
    from sage_grpo.plan.simulate import public_config
    from sage_grpo.plan.sizes import transformer_sizes

    cfg = parse_cli(TrainConfig, FLAGS)
    text, simulation = simulation_report(cfg, 4, 80.0, num_layers=2)
    sizes = planner.sizes_of(cfg)
    config = dict(public_config(sizes.transformer.config), num_layers=2)
    plan = planner.plan_launch(cfg, 4, 80.0, dataclasses.replace(sizes, transformer=transformer_sizes(config)))
    return text, simulation, plan


def test_weights_gathers_and_optimizer_state_agree_with_the_plan(simulated):
    """Per phase: the policy's and the reference's shards, FSDP's gathered units and the optimizer's state, as the
    tracker saw them at the phase's peak, equal the plan's components within 5%."""
    _, simulation, plan = simulated
    names = [p.name for p in simulation.phases]
    assert names[:3] == ["rollout", "reference", "train"] and names[3].startswith("optimizer step")
    for phase in simulation.phases[:3]:
        planned, _ = planner_groups(plan.phase(phase.name))
        for group in ("sharded weights", "gathered weights", "optimizer state"):
            assert planned[group] > 0
            assert abs(phase.group(group) / planned[group] - 1) <= TOLERANCE, (phase.name, group)


def test_every_phase_is_reported_with_its_flops(simulated):
    text, simulation, _ = simulated
    rollout, reference, train = simulation.phases[:3]
    assert rollout.flops == reference.flops > 0  # the same forward on the same shapes
    assert train.flops > 2 * rollout.flops  # backward ~2x forward, plus the checkpointed recomputation
    assert "| train | activations |" in text and "not simulated: encode" in text and "unseen by the simulation" in text
    for phase in simulation.phases:
        assert phase.total > 0 and phase.seconds >= 0


def test_activations_are_measured_not_assumed(simulated):
    """The tracker's activations are its own count (they differ from the plan's estimate; the ratios are in
    docs/benchmarks.md): positive, larger in training than in the no-grad rollout, under one block's saves without
    checkpointing times the depth."""
    _, simulation, plan = simulated
    rollout, train = simulation.phases[0], simulation.phases[2]
    assert 0 < rollout.group("activations") < train.group("activations")
    assert train.group("activations") < 64 * GIB

"""What the two reduced-depth simulation tests share (tests/unit/test_plan_simulate.py, the full fine-tune, and
tests/unit/test_plan_simulate_lora.py): the simulation and its plan at 2 real-width blocks on 4 ranks, and the
comparison of every tracker category of every transformer phase with the plan's components."""
import dataclasses
from typing import Callable, Sequence, Tuple

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.plan.simulate import GIB, planner_groups, simulated_verdict, simulation_report
from sage_grpo.plan.tracking import GROUPS

PHASES = ["rollout", "reference", "train", "optimizer step"]
# The reference launch's shape (81 x 352 x 624, 2 prompts x 4 videos, FSDP, checkpointing, sp 2, the dual KL) with
# validation off; each test adds what it varies
LAUNCH_FLAGS = ["--pretrained_model_root", "/nonexistent", "--batch_size", "2", "--num_generations", "4",
                "--enable_fsdp", "--enable_gradient_checkpointing", "--sp_size", "2", "--kl_weight", "1e-5",
                "--use_dual_kl", "True", "--validation_interval", "0", "--sample_n_frames", "81", "--rollout_height",
                "352", "--rollout_width", "624", "--replay_group_size", "1"]
# (one trained step per forward unless a test says otherwise: at 2 blocks the plan's training activations count
# 0.14 GB per row of saves the backward has consumed by its peak, a share that grows with the rows of a grouped replay)


def simulate_two_blocks(flags: Sequence[str]):
    """(printed text, simulation, plan) of the launch ``flags`` at 2 blocks on 4 ranks (the plan at that depth too)."""
    from sage_grpo.plan import memory as planner
    from sage_grpo.plan.simulate import public_config
    from sage_grpo.plan.sizes import transformer_sizes

    cfg = parse_cli(TrainConfig, list(flags))
    text, simulation = simulation_report(cfg, 4, 80.0, num_layers=2)
    sizes = planner.sizes_of(cfg)
    config = dict(public_config(sizes.transformer.config), num_layers=2)
    plan = planner.plan_launch(cfg, 4, 80.0, dataclasses.replace(sizes, transformer=transformer_sizes(config)))
    return text, simulation, plan


def assert_categories_agree(simulation, plan, allowed: Callable[[str, str], Tuple[float, float]],
                            label: str = "") -> int:
    """Every group of tracker categories of the four transformer phases at a ratio to the plan's components within
    ``allowed(phase, group)`` = (lowest, highest) (a group the plan leaves empty is empty in the simulation too);
    returns how many compared."""
    assert [p.name for p in simulation.phases][:4] == PHASES
    compared = 0
    for phase in simulation.phases[:4]:
        planned, _ = planner_groups(plan.phase(phase.name))
        for group in GROUPS:
            simulated_bytes = phase.group(group)
            if planned[group] == 0:
                assert simulated_bytes < 0.001 * GIB, (label, phase.name, group, simulated_bytes)
                continue
            compared += 1
            ratio = simulated_bytes / planned[group]
            lowest, highest = allowed(phase.name, group)
            assert lowest <= ratio <= highest, (label, phase.name, group, ratio)
    return compared


def assert_verdict_agrees(text: str, simulation, plan, tolerance: float) -> None:
    """The simulated peak (tracked + the plan's figures for what is not simulated) within ``tolerance`` of the
    plan's, so a budget 10% below the planned peak is over budget in both and 10% above fits in both."""
    verdict = simulation.verdict
    assert verdict.fits and plan.fits() and "simulated verdict:" in text and "fits; the plan:" in text
    assert abs(verdict.peak / (plan.peak_gib * GIB) - 1) <= tolerance
    for scale, fits in ((0.9, False), (1.1, True)):
        budget = dataclasses.replace(plan, gpu_memory_gib=plan.peak_gib * scale)
        assert budget.fits() is fits and simulated_verdict(budget, simulation).fits is fits, scale

"""The memory plan's throughput decisions (sage_grpo/plan/throughput.py): the reward beside the reference
pass and the grouped replay, in the plan's phases and in the auto choices on CUDA and off it."""
import dataclasses

import pytest

from sage_grpo.config.train import TrainConfig
from sage_grpo.models.placement import Placement
from sage_grpo.plan import memory as planner, report as plan_report

# the reference launch's model and video on 8 GPUs, sp 2 (the default flags)
CFG = TrainConfig.of(sp_size=2, validation_interval=0)


def _component(plan, phase: str, prefix: str) -> float:
    return sum(c.bytes for c in plan.phase(phase).components if c.name.startswith(prefix))


def _plan(cfg=CFG, **placement):
    base = dict(reduce_per_backward=False, reference_on_cpu=False, reference_batch_size=8)
    return planner.plan_memory(cfg, planner.sizes_of(cfg), 8, 80.0, Placement(**{**base, **placement}))


def test_the_background_reward_is_planned_beside_the_reference_pass():
    in_line, beside = _plan(async_reward=False), _plan(async_reward=True)
    forward = _component(beside, "reference", "reward forward (SP leaders)")
    assert any(c.name.endswith("beside it (--async_reward)") for c in beside.phase("reference").components)
    assert forward == _component(in_line, "decode + reward", "reward forward") > 0.1 * 2 ** 30
    assert beside.phase("reference").bytes == in_line.phase("reference").bytes + forward
    for phase in ("rollout", "train", "optimizer step", "decode + reward"):
        assert beside.phase(phase).bytes == in_line.phase(phase).bytes
    remote = CFG.replace(remote_reward_url="http://127.0.0.1:8765")
    assert _component(_plan(remote, async_reward=True), "reference", "reward forward") == 0  # on its own GPU


def test_a_replay_group_multiplies_the_train_phase_activations_only():
    one, three = _plan(replay_group_size=1), _plan(replay_group_size=3)
    assert _component(three, "train", "activations") == 3 * _component(one, "train", "activations")
    for phase in ("rollout", "reference", "optimizer step"):
        assert three.phase(phase).bytes == one.phase(phase).bytes
    assert "b = 6," in next(c.note for c in three.phase("train").components if c.name.startswith("activations"))


def test_auto_takes_the_largest_group_that_fits_and_the_faithful_one_where_it_must():
    sizes = planner.sizes_of(CFG)
    roomy = planner.plan_launch(CFG, 8, 300.0, sizes)
    assert roomy.placement.replay_group_size == 20 and roomy.placement.async_reward  # every trained step
    auto = planner.plan_launch(CFG, 8, 80.0, sizes)
    group = auto.placement.replay_group_size
    assert auto.fits(planner.MARGIN) and 1 < group < 20
    one_more = planner.plan_memory(CFG, sizes, 8, 80.0, dataclasses.replace(auto.placement,
                                                                            replay_group_size=group + 1))
    assert not one_more.fits(planner.MARGIN)
    window = CFG.replace(sde_window_size=4, timestep_fraction=0.5)  # 2 trained steps per sample
    assert planner.plan_launch(window, 8, 200.0, sizes).placement.replay_group_size == 2
    dropout = CFG.replace(use_lora=True, lora_dropout=0.1)  # other dropout draws: not float order
    assert planner.plan_launch(dropout, 8, 200.0).placement.replay_group_size == 1
    given = CFG.replace(replay_group_size=3, async_reward="false")
    assert (planner.plan_launch(given, 8, 200.0, sizes).placement.replay_group_size,
            planner.plan_launch(given, 8, 200.0, sizes).placement.async_reward) == (3, False)
    tight = planner.plan_launch(CFG, 8, auto.peak_gib, sizes)  # the g = 1 plan no longer leaves the margin free
    assert tight.placement.replay_group_size == 1


@pytest.mark.parametrize("changes,expected", [
    ({}, (1, False)),  # the reference's arithmetic; the CPU's cores are the trainer's
    ({"remote_reward_url": "http://127.0.0.1:8765"}, (1, True)),  # the server scores: only the wait overlaps
    ({"replay_group_size": 4, "async_reward": "true"}, (4, True)),
])
def test_off_cuda_the_levers_keep_the_reference_unless_asked(changes, expected):
    cfg = CFG.replace(**changes)
    placement = planner.resolve_placement(cfg, sharded=False, device_type="cpu")
    assert (placement.replay_group_size, placement.async_reward) == expected
    from_plan = planner.resolve_placement(cfg, sharded=True, device_type="cpu",
                                          plan=planner.plan_launch(cfg, 8, 200.0))
    assert (from_plan.replay_group_size, from_plan.async_reward) == expected


def test_the_report_names_the_decisions():
    text = plan_report.report(CFG, 8, 80.0)
    assert "replay 2 trained step(s) per forward, reward in the background" in text

"""The simulated GRPO step against the plan at reduced depth: 2 dual-stream blocks at the real width,
world 4, sp 2, the reference launch's video (81 x 352 x 624), fake tensors over a fake process group
(sage_grpo/plan/simulate.py). At this video the activations outweigh a block's gathered weights, as at full depth, so
each phase peaks at the moment it peaks at 54 blocks."""
import pytest
import torch

from plan_simulate_support import (LAUNCH_FLAGS, assert_categories_agree, assert_verdict_agrees,
                                   simulate_two_blocks)

TOLERANCE = 0.05
FLAGS = LAUNCH_FLAGS + ["--use_moving_KL", "True"]
# Both gradient reductions and both optimizers: each category of each phase is compared.
LAUNCHES = {"per_backward, Muon": ["--gradient_reduction", "per_backward"],
            "per_update, Muon, 2 steps per forward": ["--gradient_reduction", "per_update", "--replay_group_size", "2"],
            "per_update, AdamW": ["--gradient_reduction", "per_update", "--use_muon", "False"]}
# Training activations at 2 blocks: 0.951 in every launch, whatever ran before in the process (the plan counts saves
# the backward has consumed by its peak, the output layers' among them; 0.978 at 54 blocks). Before the tracker ran
# without its backward hooks (sage_grpo/plan/tracking.py) they read 1.041 to 1.076, by when the garbage collector
# happened to run. Those consumed saves are about 0.14 GB per row of the transformer call (measured: 0.951 with one
# trained step per forward, 2 rows; 0.932 with 2 steps, 4 rows; 0.916 with 18, 36 rows), so a grouped replay
# reads lower at 2 blocks; at 54 blocks, where each row holds 3.7 GB, 2 steps per forward read 0.97.
GROUPED_TRAIN_ACTIVATIONS_LOWEST = 0.92


@pytest.fixture(scope="module", params=list(LAUNCHES))
def simulated(request):
    return (request.param, *simulate_two_blocks(FLAGS + LAUNCHES[request.param]))


def test_every_category_of_every_phase_agrees_with_the_plan(simulated):
    """Per phase (rollout, reference, train, optimizer step) and per group of tracker categories (sharded weights,
    gathered weights, gradients, optimizer state, activations, inputs): the tracker's bytes at the phase's peak equal
    the plan's components within 5%, and a group the plan leaves empty is empty in the simulation too."""
    launch, _, simulation, plan = simulated
    grouped = plan.placement.replay_group_size > 1
    compared = assert_categories_agree(simulation, plan, lambda phase, group: (
        GROUPED_TRAIN_ACTIVATIONS_LOWEST if grouped and (phase, group) == ("train", "activations") else 1 - TOLERANCE,
        1 + TOLERANCE), launch)
    assert compared >= 21  # 5 groups in each no-grad phase, 6 in training (gradients), 5 in the optimizer step


def test_every_phase_is_reported_with_its_flops(simulated):
    _, text, simulation, plan = simulated
    rollout, reference, train = simulation.phases[:3]
    rows = plan.placement.reference_batch_size  # the plan's reference batch; the rollout calls one transition here
    assert rows > 1 and f"{rows} transitions per call" in reference.note
    assert reference.flops == rows * rollout.flops > 0  # the same forward, batched
    assert train.flops > 2 * rollout.flops  # backward ~2x forward, plus the checkpointed recomputation
    assert "| train | activations |" in text and "not simulated: encode" in text and "unseen by the simulation" in text
    for phase in simulation.phases:
        assert phase.total > 0 and phase.seconds >= 0


def test_the_simulated_launches_run_every_throughput_lever(simulated):
    """The throughput levers are on in these launches, so the agreement above holds with each: 2 of a sample's trained
    steps replayed in one forward in one launch (the rows of the simulated train pass), the reward scored beside the
    reference pass (the CUDA default: its forward planned there, outside the simulation's categories) and the CFG
    rows of different lengths in split mask-free calls (the CUDA default)."""
    launch, text, simulation, plan = simulated
    group = plan.placement.replay_group_size
    assert group == (2 if "2 steps per forward" in launch else 1)
    assert f"forward + backward of {group} (sample, step) pair(s)" in simulation.phases[2].note
    assert plan.placement.async_reward
    assert any(c.name.endswith("beside it (--async_reward)") and c.bytes > 0
               for c in plan.phase("reference").components)
    assert "CFG rows split (the negative prompt's 8 valid text slots attend apart)" in text


def test_the_simulation_gives_its_own_verdict_and_it_agrees_with_the_plan(simulated):
    _, text, simulation, plan = simulated
    assert_verdict_agrees(text, simulation, plan, TOLERANCE)


class _LocalOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    """(elements, made under a fake mode) of every local op's output under DTensor (DTensor ops are let through to
    their local ops, as FSDPMemTracker does)."""

    def __init__(self):
        super().__init__()
        self.outputs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._guards import active_fake_mode
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        for tensor in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(tensor, torch.Tensor):
                self.outputs.append((tensor.numel(), active_fake_mode() is not None))
        return out


def test_global_norm_clip_gathers_nothing():
    """``clip_gradients`` on real FSDP2 DTensor gradients (world 4, fake process group): one scalar all-reduce, no
    all-gather, and no real tensor larger than a shard; the tensors of the global shapes it makes are fake ones inside
    DTensor's sharding propagation, which the simulation's tracker therefore skips (sage_grpo/plan/tracking.py)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    from sage_grpo.distributed.parallelize import clip_gradients
    from sage_grpo.plan.simulate import fake_process_group

    with fake_process_group(4):
        mesh = init_device_mesh("cpu", (4,))
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = list(model.parameters())
        for param in params:
            param.grad = torch.ones_like(param)
        with CommDebugMode() as comm, _LocalOutputs() as local:
            clip_gradients(params, 1.0)
        counts = {str(op): n for op, n in comm.get_comm_counts().items()}
        shard = max(p.to_local().numel() for p in params)
    assert not any("all_gather" in op for op in counts), counts
    assert sum(n for op, n in counts.items() if "all_reduce" in op) == 1, counts
    real = [n for n, fake in local.outputs if not fake]
    assert real and max(real) <= shard
    assert max(n for n, fake in local.outputs if fake) == 1024 * 256  # a global shape, fake: no memory on a GPU


def test_the_tracked_backward_leaves_no_reference_cycles():
    """A phase tracked as the simulation tracks it (``forward_only_module_tracking``) leaves no autograd node in a
    reference cycle: every saved tensor is freed when the run drops it, not when the garbage collector next runs
    (torch's ``ModTracker`` hooks made such cycles, and the simulated training activations depended on what ran
    before in the process)."""
    import gc

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sage_grpo.plan.simulate import fake_process_group
    from sage_grpo.plan.tracking import Phase, forward_only_module_tracking

    with fake_process_group(4):
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        for module in (model[0], model[2], model):
            fully_shard(module, mesh=init_device_mesh("cpu", (4,)))
        gc.collect()
        gc.disable()
        try:
            with forward_only_module_tracking(), Phase("train", model, torch.optim.SGD(model.parameters()), ()):
                model(torch.ones(8, 64, requires_grad=True)).square().mean().backward()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cycles = [type(o).__name__ for o in gc.garbage if isinstance(o, torch.autograd.graph.Node)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert cycles == []  # before: ['GeluBackward0'], held by the hook on the second Linear's input


def test_the_simulation_holds_the_drift_proxys_base_copy_sharded_like_the_reference():
    """The simulated launch builds the frozen base copy of ``--drift_proxy`` as the trainer does (a third transformer
    in --dtype, frozen, FSDP-sharded like the reference), so every simulated phase holds its shards, as the plan's
    resident component says (the whole simulation agrees with the plan at 1.00 on the sharded weights: measured with
    this launch; docs/toy_study.md, "Drift proxy")."""
    from torch.distributed.fsdp import FSDPModule

    from sage_grpo.config import parse_cli
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.models.placement import Placement
    from sage_grpo.plan import memory as planner
    from sage_grpo.plan.simulate import build_sharded, fake_process_group, public_config

    cfg = parse_cli(TrainConfig, FLAGS + ["--drift_proxy", "True", "--validation_interval", "100"])
    config = dict(public_config(planner.sizes_of(cfg).transformer.config), num_layers=2)
    with fake_process_group(4):
        policy, reference, _, _, base = build_sharded(cfg, 4, config, Placement(False, False))
        assert isinstance(base, FSDPModule) and base is not reference and not base.training
        shards = [(p.dtype, p.requires_grad, p.placements, p.to_local().shape) for p in base.parameters()]
        assert shards == [(p.dtype, p.requires_grad, p.placements, p.to_local().shape) for p in reference.parameters()]
        assert {dtype for dtype, *_ in shards} == {torch.bfloat16} and not any(grad for _, grad, *_ in shards)

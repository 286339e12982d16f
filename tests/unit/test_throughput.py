"""The throughput levers in the trainer: grouped replay (the same update and the same β sequence as one
step per forward), the reward scored beside the reference means (the same numbers, failures raised on the training
thread), and the flags' checks. The mask-free CFG attention is tested in test_attention.py, the plan's decisions in
test_plan_throughput.py."""
import dataclasses
import math
import threading

import pytest
import torch
from model_fixtures import tiny_args

from sage_grpo.config import ConfigError, parse_cli, validate_train_config
from sage_grpo.config.train import TrainConfig
from sage_grpo.distributed import ParallelDims
from sage_grpo.rewards.step_rewards import StepRewards
from sage_grpo.trainer import GRPOTrainer


def _trainer(tiny_root, tmp_path, *extra):
    return GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--max_steps", "1", "--report_to",
                                                        "none", *extra)))


def _one_pass(trainer, inputs, group: int):
    """The policy pass over ``inputs`` with ``group`` trained steps per forward, from the trainer's current state:
    (gradients, metrics, the controller's state after it)."""
    trainer.models.placement = dataclasses.replace(trainer.models.placement, replay_group_size=group)
    trainer.kl_controller.load_state_dict(inputs["controller"])
    metrics = trainer.policy_pass.backward(inputs["rollout"], inputs["embeds"], inputs["advantages"],
                                           inputs["ref_means"], inputs["shuffle"], inputs["order"], True, 0,
                                           inputs["rollout_weights"])
    grads = {name: p.grad.clone() for name, p in trainer.models.trainable_named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return grads, metrics, trainer.kl_controller.state_dict()


@pytest.mark.parametrize("rollout_weights", [True, False], ids=["first pass", "after an update"])
def test_grouped_replay_gives_the_same_update_and_beta_sequence(tiny_root, tmp_path, rollout_weights):
    """2 samples x 3 steps (the tiny run's), dual moving KL, the policy moved off the rollout's (as in a second inner
    epoch) so that the ratio, both KL terms and β all act, β past its warm-up and shrinking at every update (x0.9:
    the recent KL is above target): one step per forward (the reference) against all three of a sample's steps in one
    forward and one backward, and against groups of 2 and 1. Every gradient and every per-iteration mean agree
    within float order, and the controller saw the same six KL values in the same order, each position's loss
    weighted by the β read before its own update. Both step-wise KL references: the rollout's log-probabilities (no
    update since the rollout) and the current policy's (after an update: the paper's π_prev)."""
    trainer = _trainer(tiny_root, tmp_path)
    assert trainer.models.placement.replay_group_size == 1  # a CPU device: the reference's one step per forward
    items = [trainer.items[i] for i in trainer.prompt_sampler.indices(0)]
    embeds = trainer._encode(items, (16, 16))
    generators = [torch.Generator().manual_seed(s) for s in (1, 2)]
    rollout = trainer.sampler.rollout(trainer.models.policy, trainer.models.vae, embeds, [1, 2], num_frames=5,
                                      height=16, width=16, sde_generators=generators, decode=False)
    ref_means = trainer.reference_means(rollout, embeds, trainer.window.steps(0))
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, param in trainer.models.trainable_named_parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=noise))
    inputs = dict(rollout=rollout, embeds=embeds, advantages=torch.tensor([0.7, -0.7]), ref_means=ref_means,
                  shuffle=torch.tensor([1, 0]), order=torch.tensor([[2, 0, 1], [1, 2, 0]]),
                  controller={"kl_coef": 1e-3, "num_updates": 100, "history": [1.0] * 10},
                  rollout_weights=rollout_weights)
    single_grads, single, single_controller = _one_pass(trainer, inputs, 1)
    assert single["ratio_mean"] != 1.0 and single["kl_moving"] > 0
    assert single["KL_weight"] == pytest.approx(1e-3 * 0.9 ** 5)  # the sixth iteration's β, read before its update
    for group in (3, 2):
        grads, metrics, controller = _one_pass(trainer, inputs, group)
        assert set(metrics) == set(single) and controller["num_updates"] == single_controller["num_updates"] == 106
        for name, value in single.items():
            assert math.isclose(metrics[name], value, rel_tol=1e-5, abs_tol=1e-7), (group, name)  # fp32 sums
        # the β-weighted KL part of the loss: each position's own β (one β per group would be off by 10-20%)
        assert metrics["total_loss"] - metrics["policy_loss"] == pytest.approx(
            single["total_loss"] - single["policy_loss"], rel=1e-4)
        torch.testing.assert_close(controller["history"], single_controller["history"], rtol=1e-4, atol=1e-7)
        assert controller["kl_coef"] == single_controller["kl_coef"]
        for name, grad in single_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7, msg=f"group {group}: {name}")


def test_the_replay_group_is_checked_against_the_trained_steps():
    cfg = TrainConfig.of(sp_size=1, num_generations=2, grpo_sampling_steps=4, timestep_fraction=0.5, replay_group_size=3)
    with pytest.raises(ConfigError, match=r"\[replay-group\] --replay_group_size 3 must be in \[0, the trained steps "
                                          r"per sample, 2\].*use 0 \(auto\) or 1"):
        validate_train_config(cfg)
    validate_train_config(cfg.replace(replay_group_size=2))


def _dims():
    return ParallelDims(world_size=1, sp_size=1)


def test_background_rewards_are_the_in_line_rewards_and_errors_reach_the_training_thread():
    videos = torch.rand(2, 3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    threads = []

    def reward(batch, prompts):
        threads.append(threading.current_thread().name)
        return {"avg": batch.mean(dim=(1, 2, 3, 4)), "len": torch.tensor([float(len(p)) for p in prompts])}

    in_line = StepRewards(reward, _dims(), 1, torch.device("cpu"), background=False)
    background = StepRewards(reward, _dims(), 1, torch.device("cpu"), background=True)
    expected, group = in_line.collect(in_line.start(videos, ["a", "bb"]))
    assert threads == [threading.current_thread().name] and group is expected
    rewards, _ = background.collect(background.start(videos, ["a", "bb"]))
    assert threads[1].startswith("reward") and background.seconds > 0 and in_line.seconds == 0
    assert set(rewards) == {"avg", "len"} and all(torch.equal(rewards[k], expected[k]) for k in expected)

    def broken(batch, prompts):
        raise RuntimeError("the reward model is gone")

    failing = StepRewards(broken, _dims(), 1, torch.device("cpu"), background=True)
    pending = failing.start(videos, ["a", "bb"])  # returns: the failure belongs to the step's collection
    with pytest.raises(RuntimeError, match="the reward model is gone"):
        failing.collect(pending)
    no_avg = StepRewards(lambda batch, prompts: {"x": batch.mean((1, 2, 3, 4))}, _dims(), 1, "cpu", background=True)
    with pytest.raises(KeyError, match=r"returned \['x'\] without the 'avg' key"):
        no_avg.collect(no_avg.start(videos, ["a", "bb"]))
    for scorer in (background, failing, no_avg):
        scorer.close()


def test_the_trainer_scores_the_reward_while_the_reference_means_run(tiny_root, tmp_path):
    """--async_reward true: the reward waits until the reference pass has started (in line it would wait forever),
    runs on the worker thread, and the step trains on its scores: the logged reward mean is that of the same videos
    scored in line."""
    trainer = _trainer(tiny_root, tmp_path, "--async_reward", "true")
    assert trainer.models.placement.async_reward
    started, seen = threading.Event(), []
    reward, reference_means = trainer.reward_fn, trainer.reference_means

    def waiting_reward(videos, prompts):
        assert started.wait(60), "the reward was scored before the reference means started"
        seen.append((threading.current_thread().name, videos, prompts))
        return reward(videos, prompts)

    def marking_reference_means(*args):
        started.set()
        return reference_means(*args)

    trainer.rewards.reward_fn, trainer.reference_means = waiting_reward, marking_reference_means
    metrics = trainer.train_step()
    trainer.rewards.close()
    (thread, videos, prompts), = seen
    assert thread.startswith("reward") and metrics["background_reward_time"] > 0
    assert metrics["gathered_avg_reward_mean"] == reward(videos, prompts)["avg"].float().mean().item()

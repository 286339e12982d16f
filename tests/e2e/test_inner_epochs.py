"""Several passes per rollout (--num_inner_epochs) and the sliding window (--sde_window_size) in the trainer, on the
tiny checkpoint: the second pass is off-policy, and a resume mid-run continues exactly."""

import math

import pytest
import torch
from model_fixtures import tiny_args

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics
from sage_grpo.trainer import GRPOTrainer

pytestmark = pytest.mark.e2e


def make_trainer(root, out_dir, *extra) -> GRPOTrainer:
    return GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, out_dir, *extra)))


def test_later_passes_see_the_earlier_updates_and_the_anchor_moves_between_them(tiny_root, tmp_path):
    # 3 passes, the anchor every 2 updates (tiny_args): it moves after pass 1's update, inside the step
    trainer = make_trainer(tiny_root, tmp_path / "run", "--max_steps", "1", "--num_inner_epochs", "3")
    trainer.train()
    row = read_metrics(trainer.run_dir)[0]
    assert trainer.update_steps == 3  # one optimizer update per pass
    # pass 0 re-scores with the rollout's own weights: on-policy, exactly
    assert row["inner_epoch_0/ratio_mean"] == 1.0 and row["inner_epoch_0/kl_stepwise"] == 0.0
    # pass 1 re-scores with the weights pass 0's update produced: the ratio and the clip act; the step-wise KL is
    # measured against the policy before this update (the paper's pi_{theta_{k-1}}): 0 in value
    assert row["inner_epoch_1/ratio_mean"] != 1.0 and row["inner_epoch_1/clipfrac"] > 0.0
    assert row["inner_epoch_1/kl_stepwise"] == 0.0 and row["inner_epoch_1/kl_moving"] > 0.0
    # the anchor was refreshed after update 2 (not skipped until an outer step lands on a multiple), and pass 2
    # measures the mean-matching KL against it: the anchor is the policy pass 2 replays with, exactly
    assert trainer.anchor.last_refreshed_at == 2
    assert row["inner_epoch_2/kl_moving"] == 0.0
    assert math.isclose(row["ratio_mean"], sum(row[f"inner_epoch_{k}/ratio_mean"] for k in range(3)) / 3)


def test_stepwise_kl_against_the_rollout_policy_measures_the_drift(tiny_root, tmp_path):
    trainer = make_trainer(tiny_root, tmp_path / "run", "--max_steps", "1", "--num_inner_epochs", "2",
                           "--stepwise_kl_reference", "rollout")
    trainer.train()
    row = read_metrics(trainer.run_dir)[0]
    assert row["inner_epoch_0/kl_stepwise"] == 0.0 and row["inner_epoch_1/kl_stepwise"] != 0.0


def test_resume_with_inner_epochs_and_a_moving_window_continues_exactly(tiny_root, tmp_path):
    # 3 steps of 3; a window of 2 moving every 2 updates: step 1 trains steps 0-1, step 2 steps 1-2
    flags = ("--num_inner_epochs", "2", "--sde_window_size", "2", "--sde_window_stride", "2")
    straight = make_trainer(tiny_root, tmp_path / "straight", "--max_steps", "2", *flags)
    straight.train()
    first = make_trainer(tiny_root, tmp_path / "split", "--max_steps", "1", *flags)
    first.train()  # saves checkpoint-1 at the end
    resumed = make_trainer(tiny_root, tmp_path / "split", "--max_steps", "2", "--resume_from_checkpoint", "latest",
                           *flags)
    resumed.train()
    assert resumed.window.steps(2).tolist() == [1, 2]  # where the resumed step 2 trained
    rows_straight, rows_split = read_metrics(straight.run_dir), read_metrics(resumed.run_dir)
    assert [r["step"] for r in rows_split] == [1, 2]
    comparable = [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in rows_split]
    assert comparable == [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in rows_straight]
    assert rows_split[1]["inner_epoch_1/ratio_mean"] != 1.0
    for name, value in straight.models.policy.named_parameters():
        assert torch.equal(value, dict(resumed.models.policy.named_parameters())[name]), name

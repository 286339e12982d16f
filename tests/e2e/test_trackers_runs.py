"""Trackers in a training run: a missing package fails before any model loads; wandb offline, resumed into the
same run."""
import json
import sys

import pytest

import sage_grpo.startup.build as startup_build
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.trackers import RUN_IDS_FILE
from sage_grpo.tracking.run_dir import read_metrics, validation_rows
from sage_grpo.trainer import GRPOTrainer

from model_fixtures import tiny_args
from trackers_support import needs_wandb, wandb_run_when_written


def test_missing_tracker_package_fails_before_any_model_loads(tiny_root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(startup_build, "build_models", lambda cfg, kl_mode, placement: pytest.fail("models loaded"))
    with pytest.raises(ConfigError, match="pip install wandb"):
        GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--report_to", "wandb")))
    assert not (tmp_path / "run").exists()


@needs_wandb
def test_training_run_reports_to_wandb_and_resumes_the_same_run(tiny_root, tmp_path, offline_trackers):
    run_dir = tmp_path / "run"
    flags = ("--report_to", "tensorboard,wandb", "--save_rollout_videos", "true", "--save_interval", "1",
             "--validation_interval", "2", "--validation_fixed_size", "16x16", "--validate_video_length", "5",
             "--validation_num_inference_steps", "2")
    GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, run_dir, "--max_steps", "1", *flags))).train()
    GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, run_dir, "--max_steps", "2", *flags,
                                                 "--resume_from_checkpoint", "latest"))).train()
    first, second = (wandb_run_when_written(f, last_step=step)
                     for f, step in zip(sorted((run_dir / "wandb").glob("offline-run-*")), (1, 2)))
    assert first["id"] == second["id"] == json.loads((run_dir / RUN_IDS_FILE).read_text())["wandb"]
    assert first["config"]["sde_type"] == "sage_grpo" and first["config"]["report_to"] == ["tensorboard,wandb"]
    assert first["config"]["output_dir"] == str(run_dir) and any((run_dir / "tb").iterdir())
    rows = read_metrics(run_dir)
    for run, row in zip((first, second), rows):  # each step's scalars, under the TensorBoard tags
        logged = run["history"][row["step"]]
        assert logged["Reward/gathered_avg_reward_mean"] == row["gathered_avg_reward_mean"]
        assert logged["KL/kl_loss"] == row["kl_loss"] and logged["Train/learning_rate"] == row["learning_rate"]
        captions = logged["Video/rollout/captions"]
        assert len(captions) == 2 and all(", reward " in c and ", advantage " in c for c in captions)  # both videos
    assert second["history"][2]["Video/validation/captions"][0].endswith("(seed 930)")
    (validation,) = validation_rows(rows)  # the scored validation's scalars, under their own names
    assert second["history"][2]["Validation/avg"] == validation["Validation/avg"]

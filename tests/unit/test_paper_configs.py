"""configs/paper/: one valid post_train.py config per row of the paper's Table 2, and the launchers' reference flags
yield to a --config file while flags typed on the command line still win (sage_grpo/config/launcher.py)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.launcher import flags_not_in_config
from sage_grpo.config.schema import from_dict, load_yaml
from sage_grpo.config.validation import validate_train_config
from sage_grpo.distributed.parallelize import clip_threshold

from launch_flags import RUN_POST_TRAIN_FLAGS

REPO_ROOT = Path(__file__).resolve().parents[2]
PAPER = sorted((REPO_ROOT / "configs" / "paper").glob("*.yaml"))
WEIGHTS = {"a": {"VQ": 0.3333, "MQ": 0.3333, "TA": 0.3333}, "b": {"VQ": 0.5, "MQ": 0.5, "TA": 1.0}}


def _clip_options(cfg):
    """What the clip threshold is decided from: the optimizer section and the SP degree."""
    return cfg.optim, cfg.parallel.sp_size


def test_one_file_per_table2_row():
    rows = [f"{m}_{k}" for m in ("dance_grpo", "flow_grpo", "cps") for k in ("no_kl", "fixed_kl")] + \
        [f"sage_grpo_{k}" for k in ("no_kl", "fixed_kl", "dual_kl")]
    assert [p.stem for p in PAPER] == sorted(f"{s}_{row}" for s in "ab" for row in rows)


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_paper_config_is_valid_and_says_what_it_is(path):
    cfg = from_dict(TrainConfig, load_yaml(str(path)), source=str(path))
    validate_train_config(cfg, world_size=8)  # the 8-GPU node run_post_train.sh launches
    setting, method, kl = path.stem[0], path.stem[2:].rsplit("_", 2)[0], "_".join(path.stem.rsplit("_", 2)[1:])
    assert cfg.rollout.sde_type == method and cfg.update.use_grad_balancing == (method == "sage_grpo")
    assert json.loads(cfg.reward.reward_weights) == WEIGHTS[setting] and cfg.reward.reward_model == "videoalign_local"
    expected = {"no_kl": (0.0, False, False), "fixed_kl": (1e-5, False, False), "dual_kl": (1e-5, True, True)}[kl]
    assert (cfg.trust_region.kl_weight, cfg.trust_region.use_moving_KL, cfg.trust_region.use_dual_kl) == expected
    assert (cfg.data.batch_size, cfg.rollout.sample_n_frames, cfg.rollout.grpo_sampling_steps) == (2, 81, 20)  # the paper's own values
    assert "leaves unstated" in path.read_text()
    # the reference's --max_grad_norm 1.0 at sp 2 clips its gradient, half the full one's norm, at 1.0: the full at 2.0
    assert (cfg.optim.max_grad_norm, cfg.parallel.sp_size, clip_threshold(*_clip_options(cfg))) == (1.0, 2, 2.0)


def test_reference_launch_clips_where_the_reference_does():
    """The reference's gradient norm under --sp_size sp is 1/sp of the full gradient's (docs/differences.md), so its
    --max_grad_norm m clips the full gradient at m x sp; --max_grad_norm_units full clips it at m."""
    cfg = parse_cli(TrainConfig, RUN_POST_TRAIN_FLAGS)
    assert (cfg.optim.max_grad_norm, cfg.parallel.sp_size, clip_threshold(*_clip_options(cfg))) == (1.0, 2, 2.0)
    assert clip_threshold(*_clip_options(parse_cli(TrainConfig, [*RUN_POST_TRAIN_FLAGS, "--sp_size", "4"]))) == 4.0
    full = parse_cli(TrainConfig, [*RUN_POST_TRAIN_FLAGS, "--max_grad_norm_units", "full"])
    assert clip_threshold(*_clip_options(full)) == 1.0
    assert clip_threshold(*_clip_options(parse_cli(TrainConfig, ["--sp_size", "1", "--max_grad_norm", "0.5"]))) == 0.5


def test_launcher_defaults_yield_to_the_config(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("sde_type: flow_grpo\nuse_moving_KL: false\nenable_fsdp: false\n")
    flags = ["--sde_type", "sage_grpo", "--enable_fsdp", "--use_moving_KL", "True", "--kl_weight", "1e-5"]
    assert flags_not_in_config(str(config), flags) == ["--kl_weight", "1e-5"]
    env = dict(os.environ, DRY_RUN="1")
    line = subprocess.run(["bash", "run_post_train.sh", "--config", str(config), "--kl_weight", "0"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--sde_type" not in line and "--enable_fsdp" not in line and "--use_moving_KL" not in line
    assert "--use_dual_kl True" in line  # a default the file does not set stays
    assert line.rstrip().endswith(f"--config {config} --kl_weight 0")  # typed flags last: they win over both
    plain = subprocess.run(["bash", "run_post_train.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "--sde_type sage_grpo" in plain and "--enable_fsdp" in plain  # without --config: unchanged
    dual = REPO_ROOT / "configs" / "paper" / "b_sage_grpo_dual_kl.yaml"
    paper = subprocess.run(["bash", "run_post_train.sh", "--config", str(dual)], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert paper.split(" post_train.py ")[1].strip() == f"--config {dual}"  # it sets every reference flag

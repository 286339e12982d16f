"""The configuration surface: reference flag names, types, effective defaults, YAML layering and validity rules."""

import sys
import warnings
from pathlib import Path

import pytest
from launch_flags import RUN_POST_TRAIN_FLAGS
from procs import run_group

from sage_grpo.config import ConfigError, parse_cli, save_yaml, validate_train_config
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.schema import load_yaml, str_to_bool
from sage_grpo.config.sections import value_of
from sage_grpo.config.validation import group_layout, parse_size, validation_flow_shift

REPO_ROOT = Path(__file__).resolve().parents[2]

# Every flag of docs/reference.md#flags-and-defaults with the reference's *effective* default (argparse wins over
# the dataclass).
REFERENCE_DEFAULTS = {
    "pretrained_model_root": "ckpts", "pretrained_transformer_version": "480p_t2v", "post_train_type": "grpo",
    "learning_rate": 1e-5, "weight_decay": 0.01, "max_steps": 10000, "warmup_steps": 500,
    "gradient_accumulation_steps": 1, "max_grad_norm": 1.0, "train_timestep_shift": 3.0, "flow_snr_type": "lognorm",
    "batch_size": 2, "num_workers": 4, "prefetch_factor": 2, "num_generations": 4, "train_video_csv": None,
    "reward_model": "videoalign_local", "reward_weights": '{"VQ":0.5,"MQ":0.5,"TA":1.0}',
    "reward_checkpoint_mode": "v3", "remote_reward_url": None, "kl_weight": 1e-5, "kl_coef": 1e-7,
    "kl_min_coef": 1e-7, "use_moving_KL": True, "update_ref_model_step": 10, "use_dual_kl": True,
    "dual_kl_moving_weight": 1.0, "dual_kl_step_weight": 0.1, "sde_type": "sage_grpo", "use_grad_balancing": True,
    "enable_timestep_permutation": True, "debug_grad_flow": False, "debug_train_diagnostics_interval": 1,
    "output_dir": "./outputs", "save_interval": 100, "log_interval": 1, "dtype": "bf16", "master_weight_type": "fp32",
    "seed": 42, "validation_global_seed": 930, "i2v_prob": 0.3, "use_muon": True, "enable_fsdp": True,
    "enable_gradient_checkpointing": True, "sp_size": 8, "dp_replicate": 1, "validation_interval": 100,
    "validate_at_step0": False, "validation_prompts": None, "valid_video_csv": None,
    # validation shift: the reference ignores its flag (argparse default 5.0) and validates at the version's shift
    "validation_timestep_shift": None, "validation_fixed_size": "480x864", "validate_video_length": 81,
    "reference_mode_offload": False, "resume_from_checkpoint": None, "use_lora": False, "lora_r": 8,
    "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_modules": None, "pretrained_lora_path": None,
}
# Reference TrainingConfig values without a flag that we expose (docs/reference.md#settings-without-a-flag).
REFERENCE_INTERNAL_DEFAULTS = {
    "grpo_sampling_steps": 20, "sample_n_frames": 81, "eta": 0.5, "cfg_scale": 6.0, "neg_prompt": "",
    "infer_flow_shift_video": 5.0, "video_bucket_hw_base_size": 480, "mini_batch_size_per_update": 1,
    "clip_range": 1e-4, "adv_clip_max": 5.0, "timestep_fraction": 1.0, "use_same_noise": False, "video_fps": 24,
    "validation_num_inference_steps": 40,
}


def test_defaults_match_reference_table():
    cfg = parse_cli(TrainConfig, [])
    for name, expected in {**REFERENCE_DEFAULTS, **REFERENCE_INTERNAL_DEFAULTS}.items():
        assert value_of(cfg, name) == expected, name


def test_help_lists_every_reference_flag():
    result = run_group([sys.executable, "post_train.py", "--help"], cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    for name in REFERENCE_DEFAULTS:
        assert f"--{name}" in out, name
    for alias in ("--validation_video_length", "--video_length", "--config"):
        assert alias in out


@pytest.mark.parametrize("text,expected", [("true", True), ("FALSE", False), ("1", True), ("0", False),
                                           ("yes", True), ("No", False), ("on", True), ("off", False)])
def test_bool_parsing_like_reference(text, expected):
    assert str_to_bool(text) is expected
    assert parse_cli(TrainConfig, ["--use_lora", text]).lora.use_lora is expected


def test_bare_bool_flag_means_true_and_bad_bool_is_an_error(capsys):
    assert parse_cli(TrainConfig, ["--use_lora"]).lora.use_lora is True
    assert parse_cli(TrainConfig, ["--use_muon", "--sp_size", "1"]).optim.use_muon is True
    with pytest.raises(SystemExit):
        parse_cli(TrainConfig, ["--use_lora", "maybe"])
    assert "expected a boolean" in capsys.readouterr().err


def test_reference_launch_line_parses():
    cfg = parse_cli(TrainConfig, RUN_POST_TRAIN_FLAGS)
    assert (cfg.parallel.sp_size, cfg.validation.validate_video_length, cfg.parallel.reference_mode_offload) == (2, 121, True)
    assert cfg.parallel.enable_fsdp and cfg.parallel.enable_gradient_checkpointing and not cfg.validation.validate_at_step0
    assert cfg.model.pretrained_model_root == "./ckpts" and cfg.trust_region.kl_coef == 1e-7


def test_yaml_supplies_values_and_flags_override(tmp_path):
    path = tmp_path / "c.yaml"
    # PyYAML reads 1e-5 (no dot) as a string; the schema converts it to the field's type.
    path.write_text("kl_weight: 1e-5\nbatch_size: 4\nuse_lora: true\ntrain_video_csv: a.csv\nvideo_length: 33\n")
    cfg = parse_cli(TrainConfig, ["--config", str(path), "--batch_size", "8"])
    assert cfg.trust_region.kl_weight == 1e-5 and isinstance(cfg.trust_region.kl_weight, float)
    assert cfg.data.batch_size == 8 and cfg.lora.use_lora is True
    assert cfg.data.train_video_csv == ["a.csv"] and cfg.validation.validate_video_length == 33


def test_unknown_yaml_key_is_an_error_with_suggestion(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("kl_wieght: 0.1\n")
    with pytest.raises(SystemExit):
        parse_cli(TrainConfig, ["--config", str(path)])
    err = capsys.readouterr().err
    assert "unknown option 'kl_wieght'" in err and "kl_weight" in err


def test_resolved_config_round_trips(tmp_path):
    cfg = parse_cli(TrainConfig, ["--sde_type", "cps", "--lora_target_modules", "to_q", "to_k"])
    save_yaml(cfg, tmp_path / "run_config.yaml")
    again = parse_cli(TrainConfig, ["--config", str(tmp_path / "run_config.yaml")])
    assert again == cfg
    assert load_yaml(str(tmp_path / "run_config.yaml"))["sde_type"] == "cps"


def test_ignored_reference_flags_warn():
    with pytest.warns(UserWarning, match="--i2v_prob .* no effect"):
        parse_cli(TrainConfig, ["--i2v_prob", "0.5"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_cli(TrainConfig, ["--i2v_prob", "0.3"])  # the default changes nothing: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_cli(TrainConfig, ["--kl_weight", "0.1"])  # a real flag: no warning


def test_invalid_choice_is_an_error():
    with pytest.raises(SystemExit):
        parse_cli(TrainConfig, ["--sde_type", "ddim"])


def _cfg(**overrides):
    return TrainConfig.of(**{"sp_size": 1, **overrides})


def test_group_layout_cases():
    assert group_layout(2, 4) == (2, 1)   # B < G: a group spans G/B = 2 ranks
    assert group_layout(8, 4) == (1, 2)   # B >= G: each rank holds B/G = 2 whole groups


@pytest.mark.parametrize("overrides,world,rule", [
    (dict(sp_size=8), 1, "sp-divides-world"),                          # reference default on one process
    (dict(sp_size=2), 4, None),
    (dict(sp_size=4), 6, "sp-divides-world"),
    (dict(batch_size=3, num_generations=4), 4, "group-spans-whole-ranks"),  # 3*4 = 12 fills groups, but 4 % 3 != 0
    (dict(batch_size=6, num_generations=4), 2, "batch-holds-whole-groups"),
    (dict(batch_size=2, num_generations=4), 1, "groups-fill-the-step"),  # 2*1 = 2 videos < one group of 4
    (dict(mini_batch_size_per_update=3), 2, "mini-batch-divides-batch"),
    (dict(eta=0.0), 2, "eta-positive"),
    (dict(post_train_type="standard"), 2, "post-train-type"),
    (dict(reward_weights="{VQ:1}"), 2, None),
])
def test_validity_rules(overrides, world, rule):
    cfg = _cfg(**overrides)
    if "reward_weights" in overrides:
        with pytest.raises(ConfigError, match="not valid JSON"):
            validate_train_config(cfg, world_size=world)
        return
    if rule is None:
        validate_train_config(cfg, world_size=world)
        return
    with pytest.raises(ConfigError, match=rf"\[{rule}\].*Fix:"):
        validate_train_config(cfg, world_size=world)


def test_validation_shift_follows_the_model_version_unless_set():
    assert validation_flow_shift(_cfg()) == 5.0  # 480p_t2v
    assert validation_flow_shift(_cfg(pretrained_transformer_version="720p_t2v")) == 9.0
    assert validation_flow_shift(_cfg(pretrained_transformer_version="720p_t2v", validation_timestep_shift=5.0)) == 5.0
    assert parse_cli(TrainConfig, ["--validation_timestep_shift", "7"]).validation.validation_timestep_shift == 7.0
    assert validation_flow_shift(parse_cli(TrainConfig, RUN_POST_TRAIN_FLAGS)) == 5.0  # the launch scripts pin 5.0
    custom = dict(pretrained_transformer_version="480p_t2v_custom", batch_size=4, num_generations=4)
    with pytest.raises(ConfigError, match=r"\[flow-shift-default\].*480p_t2v_custom.*Fix: pass "
                                          r"--validation_timestep_shift"):
        validate_train_config(_cfg(**custom))
    validate_train_config(_cfg(**custom, validation_interval=0))  # no validation: no shift needed
    validate_train_config(_cfg(**custom, validation_timestep_shift=5.0))
    with pytest.raises(ConfigError, match="validation-shift-positive"):
        validate_train_config(_cfg(batch_size=4, num_generations=4, validation_timestep_shift=0.0))


def test_empty_reward_weights_select_the_fallback_weights():
    """One parser of --reward_weights with the reference's rule: "" is the empty dict, i.e. the reward's fallback
    sub-reward weights (VideoAlign: VQ = MQ = TA = 1), in validation as in the reward plan."""
    from sage_grpo.config.reward_weights import parse_reward_weights
    from sage_grpo.rewards import plan_reward_models

    validate_train_config(_cfg(batch_size=4, num_generations=4, reward_weights=""))
    assert parse_reward_weights("") == parse_reward_weights("{}") == {}
    plan = plan_reward_models("videoalign_local", parse_reward_weights(""))
    assert plan["videoalign_local"]["sub_reward"] == {"VQ": 1.0, "MQ": 1.0, "TA": 1.0}


def test_heads_must_divide_by_sp():
    with pytest.raises(ConfigError, match="heads-divisible-by-sp"):
        validate_train_config(_cfg(sp_size=3, batch_size=4, num_generations=4), world_size=3, num_attention_heads=16)
    validate_train_config(_cfg(sp_size=2, batch_size=4, num_generations=4), world_size=4, num_attention_heads=16)


def test_size_parsing():
    assert parse_size("480x864", "--x") == (480, 864) and parse_size("480*864", "--x") == (480, 864)
    assert parse_size("none", "--x") is None
    with pytest.raises(ConfigError, match="HEIGHTxWIDTH"):
        parse_size("480", "--x")

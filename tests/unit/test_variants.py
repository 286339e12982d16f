"""Model variants and their sampling settings: a cfg-distilled version samples with its own guidance (1.0) unless the
user sets one, an explicit contradiction warns once naming both values, the shift follows the version's scheduler,
and a mistyped version name fails before any model loads, listing what exists."""

import json
import os
import warnings
from pathlib import Path

import pytest
from model_fixtures import tiny_args

import post_train
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import explicit_fields, from_dict, is_explicit
from sage_grpo.models.layout import UnknownTransformerVersion, variant_config_files
from sage_grpo.models.tiny import published_sampling, write_variant_configs
from sage_grpo.models.variants import read_variant_sampling, resolve_train_sampling
from sage_grpo.pipeline.generation import plan_generation

DISTILLED = "480p_t2v_distilled"


@pytest.fixture(scope="module")
def variants_root(tiny_root, tmp_path_factory):
    """The tiny checkpoint (base 480p_t2v: guidance 6.0, shift 5.0) plus a cfg-distilled version sharing its weights,
    whose configs say guidance 1.0 and shift 7.0 (7, not 5, so a shift that follows the config is seen to)."""
    root = tmp_path_factory.mktemp("variants_root")
    for entry in tiny_root.iterdir():
        if entry.name not in ("transformer", "variants"):
            os.symlink(entry, root / entry.name)
    (root / "transformer").mkdir()
    (root / "variants").mkdir()
    os.symlink(tiny_root / "transformer" / "480p_t2v", root / "transformer" / "480p_t2v")
    os.symlink(tiny_root / "variants" / "480p_t2v", root / "variants" / "480p_t2v")
    os.symlink(tiny_root / "transformer" / "480p_t2v", root / "transformer" / DISTILLED)
    write_variant_configs(root, DISTILLED, guidance_scale=1.0, shift=7.0)
    return root


def _train(root, *flags, yaml_path=None) -> TrainConfig:
    argv = ["--pretrained_model_root", str(root), *flags] + (["--config", str(yaml_path)] if yaml_path else [])
    return parse_cli(TrainConfig, argv)


def _resolve(root, *flags, yaml_path=None):
    """(the config with the variant's sampling filled in, warnings, notes)."""
    cfg = _train(root, *flags, yaml_path=yaml_path)
    chosen = resolve_train_sampling(cfg.model, cfg.rollout, cfg.validation)
    return (cfg.replace(cfg_scale=chosen.cfg_scale, validation_timestep_shift=chosen.validation_timestep_shift),
            list(chosen.warnings), list(chosen.notes))


# ------------------------------------------------------------------ explicit-from-default


def test_the_config_records_what_the_yaml_and_the_command_line_set(tmp_path):
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text("cfg_scale: 6.0\nvideo_length: 9\n")  # video_length: an alias of validate_video_length
    cfg = parse_cli(TrainConfig, ["--config", str(yaml_path), "--model_version", "720p_t2v", "--eta", "0.7"])
    assert explicit_fields(cfg) == {"cfg_scale", "validate_video_length", "pretrained_transformer_version", "eta"}
    assert is_explicit(cfg, "cfg_scale")  # set to its default value, but set
    assert not is_explicit(cfg, "validation_timestep_shift") and not is_explicit(cfg, "kl_weight")
    assert explicit_fields(parse_cli(TrainConfig, [])) == frozenset()
    assert explicit_fields(from_dict(TrainConfig, {"seed": 1})) == {"seed"}
    # built in code there is no record: a value away from its default counts as chosen
    assert explicit_fields(TrainConfig.of(cfg_scale=4.0)) is None
    assert is_explicit(TrainConfig.of(cfg_scale=4.0), "cfg_scale") and not is_explicit(TrainConfig.of(), "cfg_scale")


# ------------------------------------------------------------------ training


def test_a_distilled_variant_samples_with_its_own_guidance_and_shift(variants_root):
    cfg, warned, notes = _resolve(variants_root, "--pretrained_transformer_version", DISTILLED)
    assert (cfg.rollout.cfg_scale, cfg.validation.validation_timestep_shift) == (1.0, 7.0)
    assert (warned, notes) == ([], [])
    # the base version keeps the reference's defaults: CFG 6.0, validation shift 5.0; rollouts stay at shift 5.0
    base, warned, _ = _resolve(variants_root)
    assert (base.rollout.cfg_scale, base.validation.validation_timestep_shift, base.rollout.infer_flow_shift_video) == (6.0, 5.0, 5.0)
    assert warned == []


def test_an_explicit_contradiction_is_used_and_warned_about_naming_both_values(variants_root, tmp_path):
    cfg, warned, _ = _resolve(variants_root, "--pretrained_transformer_version", DISTILLED, "--cfg_scale", "6")
    assert cfg.rollout.cfg_scale == 6.0 and len(warned) == 1
    guider = variant_config_files(variants_root, DISTILLED)[0]
    assert warned[0] == (f"--cfg_scale 6.0 overrides the 1.0 that variant {DISTILLED} ships with ({guider}); "
                         "--cfg_scale 1.0 (or leaving it unset) samples the variant as intended")
    # 1.0 on the base version (guidance 6.0) matters too, also when a YAML file sets it
    yaml_path = tmp_path / "no_cfg.yaml"
    yaml_path.write_text("cfg_scale: 1.0\n")
    cfg, warned, _ = _resolve(variants_root, yaml_path=yaml_path)
    assert cfg.rollout.cfg_scale == 1.0 and len(warned) == 1 and "--cfg_scale 1.0 overrides the 6.0" in warned[0]
    # the same effect is no contradiction: any scale <= 1 means no guidance
    for same in ("1", "0.5"):
        cfg, warned, _ = _resolve(variants_root, "--model_version", DISTILLED, "--cfg_scale", same)
        assert cfg.rollout.cfg_scale == float(same) and warned == []
    # the shift: an explicit validation shift against the scheduler's
    cfg, warned, _ = _resolve(variants_root, "--model_version", DISTILLED, "--validation_timestep_shift", "5")
    assert cfg.validation.validation_timestep_shift == 5.0
    assert warned == [f"--validation_timestep_shift 5.0 overrides the 7.0 that variant {DISTILLED} ships with "
                      f"({variant_config_files(variants_root, DISTILLED)[1]}); --validation_timestep_shift 7.0 (or "
                      "leaving it unset) samples the variant as intended"]


def test_a_root_without_variant_configs_keeps_the_flags_defaults(tiny_root, tmp_path):
    root = tmp_path / "old_root"  # e.g. downloaded before variants/ existed
    root.mkdir()
    for entry in tiny_root.iterdir():
        if entry.name != "variants":
            os.symlink(entry, root / entry.name)
    cfg, warned, _ = _resolve(root, "--cfg_scale", "1.0")
    assert (cfg.rollout.cfg_scale, cfg.validation.validation_timestep_shift, warned) == (1.0, None, [])
    cfg, _, _ = _resolve(root)
    assert (cfg.rollout.cfg_scale, cfg.validation.validation_timestep_shift) == (6.0, None)  # validation then uses the table's 5.0


def test_a_mistyped_version_fails_before_any_model_loads_listing_the_versions(variants_root, tmp_path, capsys):
    with pytest.raises(UnknownTransformerVersion) as info:
        _resolve(variants_root, "--pretrained_transformer_version", "480p_t2v_distiled")
    message = str(info.value)
    assert message.startswith("--pretrained_transformer_version '480p_t2v_distiled' is no transformer version of")
    assert f"present under transformer/: 480p_t2v, {DISTILLED};" in message
    assert "known names: 480p_t2v, 720p_t2v, 480p_t2v_distilled, 480p_i2v, 720p_i2v, 480p_i2v_distilled, " \
        "720p_i2v_distilled, 480p_i2v_step_distilled." in message
    # the entry point: one line, exit status 2, nothing written
    out_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        post_train.main(tiny_args(variants_root, out_dir, "--model_version", "480p_t2v_distiled"))
    assert exit_info.value.code == 2
    assert "error: --pretrained_transformer_version '480p_t2v_distiled'" in capsys.readouterr().err
    assert not out_dir.exists()


def test_the_trainer_rolls_out_and_validates_with_the_variants_guidance(variants_root, tmp_path):
    from sage_grpo.trainer import GRPOTrainer

    trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(variants_root, tmp_path / "run", "--model_version",
                                                           DISTILLED, "--validation_interval", "5")))
    assert trainer.sampler.guidance_scale == 1.0 and trainer.validation_sampler.guidance_scale == 1.0
    saved = (trainer.run_dir / "run_config.yaml").read_text()
    assert "cfg_scale: 1.0" in saved and "validation_timestep_shift: 7.0" in saved  # the resolved settings
    with pytest.warns(UserWarning, match=r"--cfg_scale 4\.0 overrides the 1\.0 that variant 480p_t2v_distilled"):
        trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(variants_root, tmp_path / "run2", "--model_version",
                                                               DISTILLED, "--cfg_scale", "4")))
    assert trainer.sampler.guidance_scale == 4.0


# ------------------------------------------------------------------ the guider config as diffusers defines it


@pytest.mark.parametrize("guider, expected", [
    ({"guidance_scale": 6.0, "enabled": False}, 1.0),  # disabled: no guidance
    ({"guidance_scale": 5.0, "use_original_formulation": True}, 6.0),  # x_c + s(x_c - x_u) = x_u + (s+1)(x_c - x_u)
    ({"_class_name": "ClassifierFreeGuidance"}, 7.5),  # the class's default scale
])
def test_guider_configs_map_onto_plain_cfg(tmp_path, guider, expected):
    path = variant_config_files(tmp_path, DISTILLED)[0]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(guider))
    assert read_variant_sampling(tmp_path, DISTILLED).guidance_scale == expected


def test_unusable_guider_configs_are_clear_errors_or_notes(tmp_path):
    guider, scheduler = variant_config_files(tmp_path, DISTILLED)
    guider.parent.mkdir(parents=True)
    guider.write_text(json.dumps({"guidance_scale": 4.0, "guidance_rescale": 0.7}))
    variant = read_variant_sampling(tmp_path, DISTILLED)
    assert variant.guidance_scale == 4.0
    assert variant.notes == (f"{guider}: guidance_rescale 0.7 is not applied (the samplers here use plain CFG)",)
    guider.write_text(json.dumps({"_class_name": "AdaptiveProjectedGuidance", "guidance_scale": 4.0}))
    with pytest.raises(ConfigError, match="guider 'AdaptiveProjectedGuidance' is not implemented.*--cfg_scale"):
        read_variant_sampling(tmp_path, DISTILLED)
    guider.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read .*guider_config.json"):
        read_variant_sampling(tmp_path, DISTILLED)
    guider.unlink()
    scheduler.parent.mkdir(parents=True)
    scheduler.write_text(json.dumps({"shift": -1}))
    with pytest.raises(ConfigError, match=r"scheduler_config.json: shift must be a finite number > 0, got -1"):
        read_variant_sampling(tmp_path, DISTILLED)


# ------------------------------------------------------------------ generate.py


def test_generate_picks_the_distilled_version_and_its_guidance(variants_root):
    def plan(*flags):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing of this is a compatibility warning any more
            config = parse_cli(GenerateConfig, ["--prompt", "A cat", "--model_path", str(variants_root), *flags])
        return plan_generation(config)

    distilled = plan("--cfg_distilled")
    assert (distilled.transformer_version, distilled.guidance_scale, distilled.flow_shift) == (DISTILLED, 1.0, 7.0)
    assert distilled.warnings == []
    assert plan("--model_version", DISTILLED).guidance_scale == 1.0
    base = plan()
    assert (base.transformer_version, base.guidance_scale, base.flow_shift, base.warnings) == ("480p_t2v", 6.0, 5.0, [])
    override = plan("--cfg_distilled", "--guidance_scale", "6", "--flow_shift", "7")
    assert (override.guidance_scale, override.flow_shift) == (6.0, 7.0) and len(override.warnings) == 1
    assert override.warnings[0].startswith("--guidance_scale 6.0 overrides the 1.0 that variant 480p_t2v_distilled")
    with pytest.raises(ValueError, match="--model_version and --cfg_distilled both choose"):
        plan("--cfg_distilled", "--model_version", DISTILLED)
    with pytest.raises(UnknownTransformerVersion, match=r"--model_version '480p_t2v_distiled' .* present under "
                                                        r"transformer/: 480p_t2v, 480p_t2v_distilled; known names"):
        plan("--model_version", "480p_t2v_distiled")


def test_generate_entry_point_reports_a_bad_version_in_one_line(variants_root, capsys):
    import generate

    assert generate.main(["--prompt", "A cat", "--model_path", str(variants_root), "--model_version", "1080p"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model_version '1080p' is no transformer version") and err.count("\n") == 1


def test_the_tiny_writer_gives_each_version_its_configs(tiny_root):
    base = read_variant_sampling(tiny_root, "480p_t2v")  # written by write_tiny_hunyuan
    assert (base.guidance_scale, base.flow_shift) == (6.0, 5.0)
    assert Path(base.guidance_source) == variant_config_files(tiny_root, "480p_t2v")[0]
    # what it writes for the other versions (write_tiny_hunyuan(versions=...) passes these to write_variant_configs)
    assert published_sampling("480p_t2v_distilled") == (1.0, 5.0)
    assert published_sampling("720p_t2v") == (6.0, 9.0) and published_sampling("720p_i2v_distilled") == (1.0, 7.0)
    assert published_sampling("480p_i2v_step_distilled") == (1.0, 7.0)


def test_an_unpublished_version_is_refused_in_one_line_naming_the_published_ones(variants_root, capsys):
    import generate

    from sage_grpo.cli import verify

    # 720p_t2v_distilled: named upstream as coming soon, no diffusers-format repository holds it
    assert generate.main(["--prompt", "A cat", "--model_path", str(variants_root), "--resolution", "720p",
                          "--cfg_distilled"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model_version '720p_t2v_distilled' is no transformer version") and \
        err.count("\n") == 1
    assert "(it has no published weights: HunyuanVideo-1.5's authors list it as coming soon" in err
    assert "known names: 480p_t2v, 720p_t2v, 480p_t2v_distilled, 480p_i2v," in err
    # download_weights.sh asks this before fetching anything
    assert verify.main(["--published", "--transformer_versions", "480p_t2v", "720p_t2v_distilled"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --variant '720p_t2v_distilled' is no published HunyuanVideo-1.5 variant (it has no "
                   "published weights: HunyuanVideo-1.5's authors list it as coming soon, and no diffusers-format repository "
                   "holds it); published variants: 480p_t2v, 720p_t2v, 480p_t2v_distilled, 480p_i2v, 720p_i2v, "
                   "480p_i2v_distilled, 720p_i2v_distilled, 480p_i2v_step_distilled\n")
    assert verify.main(["--published", "--transformer_versions", "480p_t2v", "480p_i2v_step_distilled"]) == 0

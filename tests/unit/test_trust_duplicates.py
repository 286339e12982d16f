"""A prompt CSV whose header names a column twice, and a YAML file that gives a key twice, are refused in one line
naming the file, the column or key and its line, by every command that reads them (before: the last one was taken
without a word, so a run could train on another column or setting than the one the user read in the file)."""

import pytest
from model_fixtures import tiny_args

import sage_grpo.startup.build as startup_build
from sage_grpo.cli.generate import main as generate_main
from sage_grpo.cli.train import main as train_main
from sage_grpo.config.launcher import main as launcher_main
from sage_grpo.config.train import read_run_config
from sage_grpo.config.validation import ConfigError
from sage_grpo.evaluate import main as evaluate_main

pytestmark = pytest.mark.unit


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda cfg, kl_mode, placement: pytest.fail("models loaded although the input is invalid"))


def _refused(capsys, main, argv) -> str:
    """The one stderr line of ``main(argv)``, which must stop with status 2 (returned or by SystemExit)."""
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_csv_header_naming_a_column_twice_is_refused_by_every_reader(tiny_root, tmp_path, no_models, capsys):
    csv = tmp_path / "prompts.csv"
    csv.write_text("prompt,seed, prompt\nA cat walks,1,A dog runs\n")  # names are compared without spaces
    expected = (f"prompt CSV {str(csv)!r}, line 1: the header names column 'prompt' twice (columns: ['prompt', "
                "'seed', 'prompt']). Keep one, or rename the other")
    run = tmp_path / "run"
    for main, argv in (
            (train_main, tiny_args(tiny_root, run, "--train_video_csv", str(csv))),
            (train_main, tiny_args(tiny_root, run, "--valid_video_csv", str(csv), "--validation_interval", "1")),
            (generate_main, ["--valid_video_csv", str(csv), "--model_path", str(tiny_root), "--device", "cpu",
                             "--output_path", str(tmp_path / "videos")]),
            (evaluate_main, ["--checkpoints", "base", "--prompts", str(csv), "--metrics", "target_color",
                             "--model_path", str(tiny_root), "--output", str(tmp_path / "eval")])):
        assert _refused(capsys, main, argv) == f"error: {expected}"
    assert not run.exists() and not (tmp_path / "videos").exists() and not (tmp_path / "eval").exists()


def test_a_yaml_key_given_twice_is_refused_by_every_reader(tmp_path, capsys):
    config = tmp_path / "settings.yaml"
    config.write_text("max_steps: 3\nlearning_rate: 1.0e-3\nmax_steps: 30\n")
    line = "line 3: key 'max_steps' is given twice (first on line 1); YAML would keep only the last value. Keep one"
    for main in (train_main, generate_main, evaluate_main):  # --config, read before any option is checked
        assert _refused(capsys, main, ["--config", str(config)]).endswith(f": error: --config {config}: {line} "
                                                                          "(--help lists every option)")
    assert _refused(capsys, launcher_main, [str(config), "--max_steps", "4"]) == f"error: --config {config}: {line}"

    nested = tmp_path / "run_config.yaml"  # a run's recorded settings (resume, export, generate.py read them)
    nested.write_text("max_steps: 3\nextra_rewards:\n  toy_red: 1.0\n  brightness: 0.5\n  toy_red: 2.0\n")
    with pytest.raises(ConfigError) as refused:
        read_run_config(nested)
    assert str(refused.value) == (f"{nested} (the run's recorded settings): line 5: key 'toy_red' is given twice "
                                  "(first on line 3); YAML would keep only the last value. Keep one")


def test_yaml_merge_keys_still_override(tmp_path):
    """A `<<:` merge and a key after it are not a key given twice: the key overrides the merged one, as in YAML."""
    from sage_grpo.config.schema import load_yaml

    config = tmp_path / "merge.yaml"
    config.write_text("base: &b {toy_red: 1.0, brightness: 0.5}\nextra_rewards:\n  <<: *b\n  toy_red: 2.0\n")
    assert load_yaml(str(config))["extra_rewards"] == {"toy_red": 2.0, "brightness": 0.5}

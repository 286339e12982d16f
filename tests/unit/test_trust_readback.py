"""Every file the project writes and reads back is an input. A checkpoint's config.yaml, a run's
run_config.yaml, a weights lock, an export's sampling.json, a training state and metrics.jsonl are checked like the
command line before anything is loaded or written (one line naming the file and the key); their values are data in
what is written next (YAML, JSON, Markdown); no command writes inside what it reads; a plug-in is recognised without
running it; a Slurm requeue before the first checkpoint starts its run again.

In-process and fast: no model is loaded (a start is stopped where the models would load) and nothing is sampled. The
evaluation's cases are in test_trust_evaluate.py.
"""

import ast
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from eval_support import linked_root
from model_fixtures import tiny_args
from trust_support import alias_bomb, write_module

import sage_grpo.startup.build as startup_build
import sage_grpo.trainer as trainer_module
from sage_grpo.config import ConfigError, parse_cli, to_dict
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import MAX_ECHO_CHARS, save_yaml
from sage_grpo.models import revisions
from sage_grpo.pipeline.generation import plan_generation
from sage_grpo.safe_io import CheckpointError
from sage_grpo.startup import resolve
from sage_grpo.startup.run_files import take_run_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda *args: pytest.fail("models loaded although the input is invalid"))


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    return lines[0]


def _checkpoint(folder: Path, config_text: str, *, step: int = 2) -> Path:
    """A one-process checkpoint-N (stand-in tensors) whose config.yaml holds ``config_text``."""
    from sage_grpo.checkpoint import write_checkpoint_files

    state = {"global_step": step, "update_steps": step, "micro_steps": step, "kl_controller": None,
             "anchor_schedule": {"last_refreshed_at": None}}
    path = folder / f"checkpoint-{step}"
    write_checkpoint_files(path, model_state={"w": torch.ones(2)}, optimizer_state={"state": {}},
                           training_state=state)
    (path / "config.yaml").write_text(config_text)
    return path


# ---------------------------------------------------------------- recorded settings: one reader, checked like flags

def test_an_alias_bomb_in_a_checkpoint_config_fails_fast_on_resume_export_and_generate(tiny_root, tmp_path,
                                                                                       no_models):
    from sage_grpo.export.weights import export_checkpoint

    checkpoint = _checkpoint(tmp_path / "run", "")
    alias_bomb(checkpoint / "config.yaml", 7, key="text_max_length")  # 4.8 million strings if expanded
    pattern = rf"{checkpoint / 'config.yaml'} \(the run's recorded settings\): text_max_length: expected one value"
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=pattern) as resumed:
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run",
                                                                    "--resume_from_checkpoint", str(checkpoint))))
    with pytest.raises(ConfigError, match=pattern) as exported:
        export_checkpoint(checkpoint, tiny_root, tmp_path / "pipe", export_format="pipeline")
    generate = GenerateConfig(model_path=str(tiny_root), checkpoint_path=str(checkpoint), prompt="a cat",
                              device="cpu", fixed_size="16x16", video_length=5)
    with pytest.raises(ConfigError, match=pattern) as generated:
        plan_generation(generate)
    assert time.perf_counter() - start < 10  # measured 0.2 s; expanding the bomb takes minutes and gigabytes
    for error in (resumed, exported, generated):
        assert len(str(error.value)) < 2 * MAX_ECHO_CHARS + 300 and "\n" not in str(error.value)
    assert not (tmp_path / "pipe").exists()  # no 170 MB sampling.json: nothing written


@pytest.mark.parametrize("recorded,match", [
    ("cfg_scale: .nan\n", r"\[cfg_scale-finite\] --cfg_scale nan is not a finite number"),
    ("cfg_scale: -1.0\n", r"\[cfg_scale-positive\] --cfg_scale -1.0 must be > 0"),
    ("text_max_length: 0\n", r"\[text_max_length-range\] --text_max_length 0 must be in \[1, 65536\]"),
    ("vision_num_semantic_tokens: 100000000\n", r"--vision_num_semantic_tokens 100000000 must be in"),
    ("pretrained_transformer_version: [1, 2]\n", "pretrained_transformer_version: expected one value"),
    ("no_such_option: 1\n", "unknown option 'no_such_option'"),
])
def test_generate_refuses_what_a_checkpoint_records_wrongly(tiny_root, tmp_path, recorded, match):
    """generate.py took a NaN cfg_scale from the checkpoint and sampled with guidance off, exit 0."""
    checkpoint = _checkpoint(tmp_path / "run", recorded)
    config = GenerateConfig(model_path=str(tiny_root), checkpoint_path=str(checkpoint), prompt="a cat",
                            device="cpu", fixed_size="16x16", video_length=5)
    with pytest.raises(ConfigError, match=rf"{checkpoint / 'config.yaml'} \(the run's recorded settings\): .*{match}"):
        plan_generation(config)


def test_recorded_settings_still_fill_generate_options(tiny_root, tmp_path):
    checkpoint = _checkpoint(tmp_path / "run", "cfg_scale: 3.5\ntext_max_length: 16\nbyt5_max_length: 8\n")
    plan = plan_generation(GenerateConfig(model_path=str(tiny_root), checkpoint_path=str(checkpoint), prompt="a cat",
                                          device="cpu", fixed_size="16x16", video_length=5))
    assert plan.guidance_scale == 3.5 and plan.config.text_max_length == 16 and plan.config.byt5_max_length == 8


def test_every_yaml_file_is_read_by_the_one_loader():
    """PyYAML's readers (yaml.safe_load, load, ..., a yaml.*Loader class) are named in exactly one place:
    yaml_file.load_yaml's safe loader, which refuses duplicate keys and whose callers check shapes."""
    uses = []
    for path in sorted((REPO_ROOT / "sage_grpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "yaml"
                    and (node.attr in ("safe_load", "load", "full_load", "unsafe_load", "load_all", "compose")
                         or node.attr.endswith("Loader"))):
                uses.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}:{node.attr}")
    assert len(uses) == 1 and uses[0].startswith("sage_grpo/config/yaml_file.py:") and uses[0].endswith(":SafeLoader"), \
        uses


def test_config_changes_are_appended_without_reading_the_history_back(tmp_path):
    from sage_grpo.resume import CONFIG_CHANGES_FILE, ResumeCheck, record_config_changes

    history = alias_bomb(tmp_path / CONFIG_CHANGES_FILE, 7)
    before = history.read_bytes()
    check = ResumeCheck(tmp_path / "checkpoint-2", False, {"global_step": 2}, {"kl_weight": (0.001, 0.0)})
    record_config_changes(tmp_path, check)
    text = history.read_bytes()
    assert text.startswith(before) and len(text) < len(before) + 200  # appended, never expanded
    assert text[len(before):].decode() == ("- resumed_from: " + str(tmp_path / "checkpoint-2") + "\n  at_step: 2\n"
                                           "  changes:\n    kl_weight:\n      checkpoint: 0.001\n      now: 0.0\n")


@pytest.mark.parametrize("state,match", [
    ({"global_step": "2"}, "global_step must be a non-negative integer, got '2'"),
    ({"global_step": 2, "layout": ["a"]}, r"layout must be a mapping, got \['a'\]"),
    ({"global_step": 2, "layout": {"videos_per_step": 2.5}}, "layout.videos_per_step must be a positive integer"),
    ({"global_step": 2, "failed_reward_steps": -1}, "failed_reward_steps must be a non-negative integer"),
])
def test_a_training_state_of_another_shape_is_one_line(tmp_path, state, match):
    from sage_grpo.resume import check_training_state

    with pytest.raises(CheckpointError, match=rf"training_state.pt: {match}"):
        check_training_state(state, tmp_path / "training_state.pt")


def test_the_failed_reward_streak_survives_a_resume():
    """A run that resumes between all-failed reward steps must still stop: the streak is checkpoint state."""
    unguarded = SimpleNamespace(state_dict=dict, load_state_dict=lambda state: None)  # the drift sentinel, off
    trainer = SimpleNamespace(global_step=5, update_steps=5, micro_steps=5, failed_reward_steps=2, sentinel=unguarded)
    state = trainer_module.GRPOTrainer.state_dict(trainer)
    assert state["failed_reward_steps"] == 2
    resumed = SimpleNamespace(sentinel=unguarded)
    trainer_module.GRPOTrainer.load_state_dict(resumed, state)
    assert resumed.failed_reward_steps == 2 and resumed.global_step == 5
    trainer_module.GRPOTrainer.load_state_dict(resumed, {"global_step": 3, "update_steps": 3, "micro_steps": 3})
    assert resumed.failed_reward_steps == 0  # a checkpoint of an earlier version


# ---------------------------------------------------------------- weights locks

@pytest.mark.parametrize("entry,match", [
    ({REPO: {"revision": "main\nmax_steps: 99999\nkl_weight: 5.0", "commit": COMMIT}},
     r"revision 'main\\nmax_steps: 99999\\nkl_weight: 5.0' is not a branch, tag or commit name"),
    ({REPO: {"revision": "main", "commit": "--upload-file=/etc/passwd"}}, "is not a 40-hex-digit commit id"),
    ({"a/b`rm -rf ~`": {"revision": "main", "commit": COMMIT}}, "is not a hub repository id"),
])
def test_a_crafted_lock_is_refused_before_it_reaches_run_config(tmp_path, entry, match):
    root, run = tmp_path / "ckpts", tmp_path / "run"
    root.mkdir()
    run.mkdir()
    (root / revisions.LOCK_FILE).write_text(json.dumps(entry))
    cfg = parse_cli(TrainConfig, ["--pretrained_model_root", str(root), "--max_steps", "3"])
    save_yaml(cfg, run / "run_config.yaml")
    before = (run / "run_config.yaml").read_text()
    with pytest.raises(ValueError, match=rf"{root / revisions.LOCK_FILE}: .*{match}"):
        revisions.record_run_weights(root, run, run / "run_config.yaml")
    assert (run / "run_config.yaml").read_text() == before and not (run / revisions.LOCK_FILE).exists()
    assert parse_cli(TrainConfig, ["--config", str(run / "run_config.yaml")]).optim.max_steps == 3
    assert revisions.main(["resolve", REPO, "main", "--lock", str(root / revisions.LOCK_FILE)]) == 2


def test_a_crafted_lock_stops_a_start_before_models_load(tiny_root, tmp_path, no_models):
    root = linked_root(tmp_path / "ckpts", tiny_root)
    (root / revisions.LOCK_FILE).write_text(json.dumps({REPO: {"revision": "main\nx: 1", "commit": COMMIT}}))
    with pytest.raises(CheckpointError, match="weights.lock.json: .*revision 'main\\\\nx: 1' is not a branch"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, tmp_path / "run")))
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- exports: read back as data, written as data

def test_the_model_card_keeps_recorded_values_as_data(tmp_path):
    from sage_grpo.export.model_card import code_span, model_card

    run = tmp_path / "run"
    checkpoint = _checkpoint(run, yaml.safe_dump({"reward_model": "x` |\n## Injected heading\n| `y",
                                                  "pretrained_transformer_version": "480p_t2v"}))
    (run / "metrics.jsonl").write_text('{"step": 1, "gathered_avg_reward_mean": 0.5, "gathered_x\\n# H_reward_mean"'
                                       ': "text", "kl_loss": "nan?"}\n')
    card = model_card(checkpoint, export_format="transformer", dtype="fp32", merged_lora=False)
    rows = [line for line in card.splitlines() if line.startswith("| `--reward_model`")]
    assert rows == ["| `--reward_model` | `` x` \\| ## Injected heading \\| `y `` |"]
    assert "\n## Injected heading" not in card and "# H_reward" not in card and "KL to the anchor" not in card
    assert code_span("a``b") == "``` a``b ```" and code_span("plain") == "`plain`"


@pytest.mark.parametrize("record,match", [
    ({"pipeline_attributes": {"tokenizer_max_length": "16; import os"}}, "pipeline_attributes.tokenizer_max_length must be an integer"),
    ({"pipeline_attributes": {"tokenizer_max_length": 10 ** 12}}, "pipeline_attributes.tokenizer_max_length must be an integer"),
    ({"pipeline_attributes": {"__class__": 1}}, "pipeline_attributes holds '__class__'"),
    ({"pipeline_attributes": {}, "guidance_scale": "NaN", "flow_shift": 5.0, "task": "t2v"}, "guidance_scale must"),
])
def test_a_crafted_sampling_record_is_refused_before_anything_is_set(tmp_path, record, match):
    from sage_grpo.export.pipeline import SAMPLING_FILE, apply_sampling_settings

    (tmp_path / SAMPLING_FILE).write_text(json.dumps({"guidance_scale": 6.0, "flow_shift": 5.0, "task": "t2v",
                                                      **record}))
    pipe = SimpleNamespace()
    with pytest.raises(ValueError, match=rf"{tmp_path / SAMPLING_FILE}: {match}"):
        apply_sampling_settings(pipe, tmp_path)
    assert vars(pipe) == {}


# ---------------------------------------------------------------- nothing written inside an input

def test_export_refuses_an_output_inside_its_inputs_or_a_file(tiny_root, tmp_path, capsys):
    from sage_grpo.cli.export import main

    root = linked_root(tmp_path / "ckpts", tiny_root)
    checkpoint = _checkpoint(tmp_path / "run", "pretrained_transformer_version: 480p_t2v\n")
    before = sorted(p.name for p in root.iterdir())
    common = ["--checkpoint", str(checkpoint), "--model_root", str(root), "--format", "pipeline",
              "--link_components", "copy"]
    assert main([*common, "--output", str(root / "exports" / "pipe")]) == 2  # copied the root into itself
    assert _one_line(capsys.readouterr().err) == (
        f"error: --output {root / 'exports' / 'pipe'} lies inside --model_root {root}: the command would write into "
        f"what it reads. Choose an --output outside {root}")
    assert main([*common, "--output", str(checkpoint / "export")]) == 2
    assert "lies inside --checkpoint" in _one_line(capsys.readouterr().err)
    (tmp_path / "taken").write_text("a file")
    assert main([*common, "--output", str(tmp_path / "taken")]) == 2  # was a NotADirectoryError traceback
    assert _one_line(capsys.readouterr().err) == f"error: --output {tmp_path / 'taken'} is a file; pass a new folder"
    assert sorted(p.name for p in root.iterdir()) == before and not (checkpoint / "export").exists()


def test_a_run_refuses_an_output_dir_inside_its_inputs(tiny_root, tmp_path, no_models):
    root = linked_root(tmp_path / "ckpts", tiny_root)
    with pytest.raises(ConfigError, match=rf"--output_dir {root / 'runs' / 'a'} lies inside --pretrained_model_root"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, root / "runs" / "a")))
    checkpoint = _checkpoint(tmp_path / "run", yaml.safe_dump(to_dict(parse_cli(TrainConfig, tiny_args(
        tiny_root, tmp_path / "run")))))
    with pytest.raises(ConfigError, match="lies inside --resume_from_checkpoint"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, checkpoint / "next",
                                                                    "--resume_from_checkpoint", str(checkpoint))))
    assert not (root / "runs").exists() and not (checkpoint / "next").exists()


def test_generate_and_convert_refuse_an_output_inside_their_inputs(tiny_root, tmp_path, capsys, monkeypatch):
    from sage_grpo.cli import generate as generate_cli
    from sage_grpo.models.convert import ConversionError, convert_reference_checkpoint

    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    root = linked_root(tmp_path / "ckpts", tiny_root)
    status = generate_cli.main(["--model_path", str(root), "--prompt", "a cat", "--device", "cpu", "--fixed_size",
                                "16x16", "--video_length", "5", "--output_path", str(root / "videos" / "cat.mp4")])
    assert status == 2 and "--output_path " in _one_line(capsys.readouterr().err)
    reference = tmp_path / "reference"
    reference.mkdir()
    with pytest.raises(ConversionError, match=rf"--output {reference / 'converted'} lies inside --reference_root"):
        convert_reference_checkpoint(reference, reference / "converted", components=["vae"], log=lambda line: None)
    assert sorted(os.listdir(reference)) == []


# ---------------------------------------------------------------- plug-ins recognised without running them

@pytest.mark.parametrize("source", [
    "# a reward_plugin some day\ndef fn(videos, prompts):\n    return {}\n",
    "NOTE = 'uses @reward_plugin'\ndef fn(videos, prompts):\n    return {}\n",
    "from sage_grpo.rewards import reward_plugin\n\ndef fn(videos, prompts):\n    return {}\n\n"
    "@reward_plugin\ndef other(videos, prompts):\n    return {}\n",
])
def test_a_module_that_only_mentions_reward_plugin_never_runs(tmp_path, monkeypatch, source):
    from sage_grpo.rewards import import_object

    marker = tmp_path / "code_ran"
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "mentions_plugin", f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" + source)
    with pytest.raises(ImportError, match=r"refusing reward plug-in 'mentions_plugin:fn': 'fn' is not marked with "
                                          r"@reward_plugin where 'mentions_plugin' defines it \(checked in its source"):
        import_object("mentions_plugin:fn")
    assert not marker.exists()


def test_declared_plugins_still_load(tmp_path, monkeypatch):
    from sage_grpo.rewards import import_object

    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "declared_plugins.scores", (
        "import sage_grpo.rewards as rewards\nfrom sage_grpo.rewards import reward_plugin\n\n"
        "def _mean(videos, prompts):\n    return {'mean': videos.mean(dim=(1, 2, 3, 4))}\n\n"
        "assigned = reward_plugin(_mean)\n\n"
        "class Holder:\n    @rewards.reward_plugin\n    class Inner:\n        def __call__(self, videos, prompts):\n"
        "            return {'one': videos.new_ones(len(prompts))}\n"))
    assert import_object("declared_plugins.scores:assigned").__name__ == "_mean"
    assert import_object("declared_plugins.scores:Holder.Inner").__name__ == "Inner"


# ---------------------------------------------------------------- a Slurm requeue before the first checkpoint

def test_a_requeue_before_the_first_checkpoint_starts_the_run_again(tiny_root, tmp_path, no_models):
    """The Slurm script continues a requeued job with --resume_from_checkpoint auto (test_slurm_launch.py)."""
    run = tmp_path / "run"
    args = tiny_args(tiny_root, run, "--resume_from_checkpoint", "auto")
    run.mkdir()
    save_yaml(parse_cli(TrainConfig, tiny_args(tiny_root, run)), run / "run_config.yaml")  # the first attempt's,
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')  # which logged a step before it was preempted
    with pytest.raises(pytest.fail.Exception, match="models loaded"):  # was "already holds a run"
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args))
    with pytest.raises(ConfigError, match=r"--resume_from_checkpoint auto: .* holds a run without a checkpoint yet, "
                                          r"started with settings that define a different run: --learning_rate "
                                          r"0.001 -> 0.002"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + ["--learning_rate", "2e-3"]))
    alias_bomb(run / "run_config.yaml", 7)
    with pytest.raises(ConfigError, match=r"run_config.yaml \(the run's recorded settings\): reward_kwargs: expected"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args))
    cfg = parse_cli(TrainConfig, args)
    save_yaml(cfg, run / "run_config.yaml")
    start = resolve(cfg)
    assert start.plan.resume.restart and start.plan.resume.check is None
    take_run_dir(start.cfg, start.plan, start.run_claim, [])
    assert (run / "metrics.jsonl").read_text() == ""  # the steps the restart takes again are logged once


"""Trust: files and configs never run code, bad inputs are named before any model loads, resume refuses what it
cannot continue, and a failed start leaves an earlier run as it was (docs/failures.md)."""
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import sage_grpo.startup.build as startup_build
from sage_grpo.checkpoint import write_checkpoint_files
from sage_grpo.config import ConfigError, parse_cli, to_dict
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.schema import from_dict
from sage_grpo.data import read_prompt_csvs
from sage_grpo.export.weights import read_dcp_state_dict
from sage_grpo.rewards import build_reward_fn, import_object
from sage_grpo.safe_io import CheckpointError, UnsafeFileError, dcp_load, load_plain, read_dcp_metadata
from sage_grpo.tracking.run_dir import read_metrics, truncate_metrics
from sage_grpo.trainer import GRPOTrainer

from model_fixtures import tiny_args
from trust_support import write_module


class RunsCode:
    """Pickles into a call of ``os.system`` (what a crafted checkpoint file does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "code_ran"
    yield path
    assert not path.exists(), "a crafted file ran code"


def _checkpoint(root: Path, step: int = 2, **training) -> Path:
    state = {"global_step": step, "update_steps": step, "micro_steps": step, "kl_controller": None,
             "anchor_schedule": {"last_refreshed_at": None}, **training}
    path = root / f"checkpoint-{step}"
    write_checkpoint_files(path, model_state={"w": torch.ones(2)}, optimizer_state={"state": {}},
                           training_state=state)
    return path


@pytest.mark.parametrize("part", ["training_state.pt", "optimizer.pt"])
def test_crafted_pickles_in_a_checkpoint_are_refused(tmp_path, marker, part):
    """Both are read with load_plain: training_state.pt by check_resume, optimizer.pt by CheckpointManager.load
    (test_trainer_parts: the manager refuses a crafted optimizer.pt)."""
    path = _checkpoint(tmp_path)
    torch.save({"payload": RunsCode(marker)}, path / part)
    with pytest.raises(UnsafeFileError, match=f"refusing to load .*{part}.*posix.system|refusing to load .*{part}"):
        load_plain(path / part, part)


def test_plain_checkpoint_parts_load(tmp_path):
    import numpy as np

    path = _checkpoint(tmp_path, rng={"numpy": np.random.get_state()})  # earlier versions stored a NumPy array
    assert load_plain(path / "training_state.pt", "training state")["global_step"] == 2
    assert load_plain(path / "optimizer.pt", "optimizer state") == {"state": {}}


def test_truncated_and_missing_parts_are_named(tmp_path):
    path = _checkpoint(tmp_path)
    (path / "training_state.pt").write_bytes((path / "training_state.pt").read_bytes()[:40])
    with pytest.raises(CheckpointError, match="training_state.pt"):
        load_plain(path / "training_state.pt", "training state")
    (path / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="optimizer.pt is missing"):
        load_plain(path / "optimizer.pt", "optimizer state")


def _dcp_folder(tmp_path) -> Path:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "transformer_dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in this process alone"
        dcp.save({"model": {"w": torch.arange(4.0)}, "lr": 0.5}, checkpoint_id=str(folder))
    return folder


def test_dcp_checkpoints_load_through_the_safe_reader(tmp_path):
    folder = _dcp_folder(tmp_path)
    assert set(read_dcp_metadata(folder).state_dict_metadata) == {"model.w", "lr"}
    assert torch.equal(read_dcp_state_dict(folder)["w"], torch.arange(4.0))
    state = {"model": {"w": torch.zeros(4)}, "lr": 0.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_load(state, folder)
    assert state["lr"] == 0.5 and torch.equal(state["model"]["w"], torch.arange(4.0))


def test_crafted_dcp_metadata_is_refused(tmp_path, marker):
    folder = _dcp_folder(tmp_path)
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(UnsafeFileError, match="posix.system|names"):
        read_dcp_state_dict(folder)  # generate.py --checkpoint_path and export take this path


def test_crafted_dcp_byte_item_is_refused(tmp_path, marker):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2), "extra": RunsCode(marker)}, checkpoint_id=str(folder))
        with pytest.raises(UnsafeFileError, match="extra"):
            dcp_load({"w": torch.zeros(2), "extra": None}, folder)


def test_crafted_prompt_cache_is_refused(tmp_path, marker):
    cache = tmp_path / "prompts.pt"
    torch.save({"identity": RunsCode(marker)}, cache)
    with pytest.raises(UnsafeFileError, match="prompt-embedding cache"):
        load_plain(cache, "prompt-embedding cache")


def test_plugins_need_the_reward_plugin_mark(tmp_path, monkeypatch, marker):
    monkeypatch.syspath_prepend(str(tmp_path))
    side_effect = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    write_module(tmp_path, "noisy_module", side_effect + "def fn(videos, prompts):\n    return {}\n")
    write_module(tmp_path, "marked_rewards", "from sage_grpo.rewards import reward_plugin\n\n"
                 "@reward_plugin\ndef good(videos, prompts):\n    return {'s': videos.mean(dim=(1, 2, 3, 4))}\n\n"
                 "def unmarked(videos, prompts):\n    return {}\n")
    # not a reward module: refused before its import could run anything
    for path in ("noisy_module:fn", "noisy_module.sub:fn", "subprocess:Popen", "os:system"):
        with pytest.raises(ImportError, match="refusing|no module"):
            import_object(path)
    with pytest.raises(ImportError, match="not marked"):
        import_object("marked_rewards:unmarked")
    assert import_object("marked_rewards:good").__name__ == "good"
    with pytest.raises(ValueError, match="JSON data"):
        build_reward_fn("brightness", extra_models={"brightness": {"weight": 1.0, "kwargs": {"x": object()}}})


def test_a_config_naming_popen_is_refused_before_models_load(tmp_path, monkeypatch, marker):
    monkeypatch.setattr(startup_build, "build_models", lambda cfg, kl_mode, placement: pytest.fail("models loaded"))
    config = tmp_path / "evil.yaml"
    config.write_text(yaml.safe_dump({"reward_model": "subprocess:Popen", "reward_weights": "{}",
                                      "reward_kwargs": f'{{"args": "touch {marker}", "shell": true}}'}))
    cfg = parse_cli(TrainConfig, ["--config", str(config), "--output_dir", str(tmp_path / "run"), "--sp_size", "1",
                                  "--num_generations", "2",
                                  "--device", "cpu", "--pretrained_model_root", str(tmp_path / "none")])
    with pytest.raises(ConfigError, match="refusing reward plug-in 'subprocess:Popen'"):
        GRPOTrainer(cfg)


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda cfg, kl_mode, placement: pytest.fail("models loaded although the input is invalid"))


def _csv(tmp_path, text: bytes) -> str:
    path = tmp_path / "prompts.csv"
    path.write_bytes(text)
    return str(path)


@pytest.mark.parametrize("extra,match", [
    (["--eta", "nan"], "eta-finite"),
    (["--learning_rate", "inf"], "learning_rate-finite"),
    (["--learning_rate", "nan"], "learning_rate-finite"),
    (["--kl_weight", "-1"], "kl-nonnegative"),
    (["--lora_dropout", "1.5"], "lora-dropout"),
    (["--reward_model", "no_such_pkg.rewards:fn"], "no module named 'no_such_pkg.rewards'"),
    (["--reward_kwargs", "{not json"], "not valid JSON"),
    (["--resume_from_checkpoint", "/no/such/dir"], "no such directory"),
])
def test_bad_flags_are_named_before_models_load(tiny_root, tmp_path, no_models, extra, match):
    with pytest.raises((ConfigError, FileNotFoundError), match=match):
        GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", *extra)))


@pytest.mark.parametrize("value", ["2.5", "2.5e0", "1e-1"])
def test_integer_flags_take_integers_only(value):
    with pytest.raises(ValueError, match="max_steps"):
        from_dict(TrainConfig, {"max_steps": value})
    assert from_dict(TrainConfig, {"max_steps": "1e3"}).optim.max_steps == 1000


@pytest.mark.parametrize("content,match", [
    (b"prompt,seed\nA cat,1\n\xff\xfe broken,2\n", r"prompts.csv', line 3: not UTF-8"),
    (b"prompt,seed\nA cat,1\n" + b"x" * 20000 + b",2\n", r"prompts.csv, row 3: the prompt is 20000 bytes"),
    (b"prompt,seed\nA cat,one\n", r"prompts.csv, row 2: index and seed must be integers"),
])
def test_csv_errors_name_the_file_and_row(tmp_path, content, match):
    with pytest.raises(ConfigError, match=match):
        read_prompt_csvs([_csv(tmp_path, content)])


def test_empty_prompt_rows_are_reported(tmp_path):
    notes = []
    items = read_prompt_csvs([_csv(tmp_path, b"prompt,seed\nA cat,1\n,2\n  ,3\nA dog,4\n")], notes=notes)
    assert [i.prompt for i in items] == ["A cat", "A dog"]
    assert notes == [f"prompt CSV {tmp_path / 'prompts.csv'}: 2 row(s) with an empty prompt skipped (line 3, 4)"]


def test_torn_metric_lines_are_dropped_with_a_warning(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    with pytest.warns(RuntimeWarning, match="line 3: not a complete metrics row"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.warns(RuntimeWarning):
        truncate_metrics(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def _resume_checkpoint(tmp_path, cfg_args, *, anchor: bool, anchor_moved: bool) -> Path:
    """A checkpoint as the trainer writes it (small stand-in tensors), with the config of ``cfg_args``."""
    cfg = parse_cli(TrainConfig, cfg_args)
    state = {"global_step": 2, "update_steps": 2, "micro_steps": 2, "kl_controller": None,
             "anchor_schedule": {"last_refreshed_at": 2 if anchor_moved else None},
             "layout": {"world_size": 1, "dp_size": 1, "sp_size": 1, "videos_per_step": cfg.data.batch_size}}
    path = tmp_path / "run" / "checkpoint-2"
    write_checkpoint_files(path, model_state={"w": torch.ones(2)}, optimizer_state={"state": {}},
                           training_state=state, anchor_state={"w": torch.ones(2)} if anchor else None,
                           config_yaml=yaml.safe_dump(to_dict(cfg)))
    return path


def test_resume_refusals(tiny_root, tmp_path, no_models):
    args = tiny_args(tiny_root, tmp_path / "run")
    path = _resume_checkpoint(tmp_path, args, anchor=False, anchor_moved=True)
    resume = ["--resume_from_checkpoint", str(path)]
    with pytest.raises(CheckpointError, match="lacks the moving anchor .*anchor/model.safetensors"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume))

    path = _resume_checkpoint(tmp_path, args, anchor=True, anchor_moved=True)
    with pytest.raises(ConfigError, match=r"--sde_type 'sage_grpo' -> 'flow_grpo'; --learning_rate 0.001 -> 0.002"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--sde_type", "flow_grpo", "--learning_rate", "2e-3"]))
    with pytest.raises(pytest.fail.Exception, match="models loaded"):  # allowed: the preflight passes
        GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--sde_type", "flow_grpo", "--allow_config_change"]))
    with pytest.raises(ConfigError, match=r"videos per step \(batch_size x dp\) 2 -> 4"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--batch_size", "4"]))
    # changing what does not define the run is fine
    with pytest.raises(pytest.fail.Exception, match="models loaded"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--max_steps", "99", "--log_interval", "5"]))

    (path / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="optimizer.pt is missing"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume))
    weights = path / "transformer" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="transformer/model.safetensors"):
        GRPOTrainer(parse_cli(TrainConfig, args + resume))


def test_max_steps_defines_the_run_only_under_a_decaying_lr_schedule():
    from sage_grpo.resume import config_differences

    for schedule, defines in (("constant", False), ("constant_with_warmup", False), ("cosine", True)):
        saved = to_dict(TrainConfig.of(lr_scheduler=schedule, max_steps=100))
        differences = config_differences(saved, to_dict(TrainConfig.of(lr_scheduler=schedule, max_steps=200)))
        assert differences == ({"max_steps": (100, 200)} if defines else {}), schedule

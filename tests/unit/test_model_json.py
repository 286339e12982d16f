"""The JSON files of a model folder (configs, shard indices), and every JSON file a run writes and reads back, are read
as untrusted data: a garbled, oversized, deeply nested or non-object file is one line naming it, and a shard index
cannot point outside its folder."""

import ast
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

import sage_grpo
from sage_grpo import safe_io
from sage_grpo.safe_io import reading as safe_reading
from sage_grpo.config.validation import ConfigError
from sage_grpo.models import load_components
from sage_grpo.models.sharded_load import INDEX_FILE, SINGLE_FILE, weight_files
from sage_grpo.pipeline.generation import _vae_ratios
from sage_grpo.safe_io import CheckpointError, read_json_object, read_weight_map

GARBLED = {
    "truncated": b'{"shift": 5.0',
    "a list": b"[1, 2]",
    "not UTF-8": b'{"a": "\xff\xfe"}',
    "nested past the recursion limit": b"[" * 200_000 + b"]" * 200_000,
    "an integer of 5000 digits": b'{"a": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("content", GARBLED.values(), ids=GARBLED.keys())
def test_a_garbled_file_is_one_line_naming_it(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        read_json_object(path, "the VAE config")
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "the VAE config" in message
    assert "download_weights.sh" in message  # what to do about it


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pad": "x" * 100}))
    assert read_json_object(path, "the config", max_bytes=path.stat().st_size)["pad"] == "x" * 100  # at the cap
    monkeypatch.setattr(safe_reading.json, "loads", lambda *_: pytest.fail("parsed an oversized file"))
    with pytest.raises(CheckpointError, match=r"is 0\.0 MiB, more than such a file holds"):
        read_json_object(path, "the config", max_bytes=64)


def test_the_error_class_is_the_callers(tmp_path):
    path = tmp_path / "missing.json"
    with pytest.raises(ConfigError, match="cannot read the guider config .*missing.json"):
        read_json_object(path, "the guider config", error=ConfigError)
    path.write_text('{"guidance_scale": 6.0}')
    assert read_json_object(path, "the guider config") == {"guidance_scale": 6.0}


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/x.safetensors", "..",
                                   ""])
def test_a_shard_index_cannot_point_outside_its_folder(tmp_path, shard):
    index = tmp_path / INDEX_FILE
    index.write_text(json.dumps({"weight_map": {"a": "model-00001.safetensors", "b": shard}}))
    with pytest.raises(CheckpointError, match="not a file name beside the index"):
        read_weight_map(index)


def test_a_shard_index_with_plain_names_is_read(tmp_path):
    index = tmp_path / INDEX_FILE
    index.write_text(json.dumps({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-1.safetensors"}}))
    assert read_weight_map(index) == {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-1.safetensors"}
    assert safe_io.shard_names(index) == ["m-1.safetensors", "m-2.safetensors"]
    index.write_text(json.dumps({"weight_map": {"a": 1}}))
    with pytest.raises(CheckpointError, match="must map tensor names to shard file names"):
        read_weight_map(index)


def test_sharded_weights_are_never_read_from_beside_the_folder(tmp_path):
    """A tampered index naming ``../outside.safetensors`` was followed: the weights came from outside the model."""
    folder = tmp_path / "root" / "transformer"
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "root" / "outside.safetensors"))
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    with pytest.raises(CheckpointError, match="'../outside.safetensors' is not a file name beside the index"):
        weight_files(folder)
    assert not (folder / SINGLE_FILE).exists()


def test_a_garbled_scheduler_config_is_named_before_any_model_loads(tiny_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(tiny_root, root)
    config = root / "scheduler" / "scheduler_config.json"
    config.write_text('{"shift": 5.0,')
    with pytest.raises(CheckpointError) as info:
        load_components(root)
    assert str(config) in str(info.value) and "the scheduler config" in str(info.value)


@pytest.mark.parametrize("content", ['{"temporal_compression_ratio": 4', "[4, 16]"])
def test_a_garbled_vae_config_is_named(tmp_path, content):
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match="the VAE config"):
        _vae_ratios(str(tmp_path))


# ---------------------------------------------------------------- every JSON file the project reads back

PACKAGE = Path(sage_grpo.__file__).parent


def _file_json_parses(tree: ast.AST) -> list:
    """Lines where ``json.load(...)`` runs, or ``json.loads`` is handed a file's contents (``.read_text()``,
    ``.read_bytes()``, ``.read()`` of a file)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
            continue
        argument = node.args[0] if node.args else None
        reads_a_file = (isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute)
                        and argument.func.attr in ("read_text", "read_bytes")
                        or node.func.attr == "load")
        if reads_a_file:
            found.append(node.lineno)
    return found


def test_no_module_parses_a_files_json_but_through_read_json_object():
    """One reader, one set of checks (size cap, one line naming the file): a new ``json.loads(path.read_text())``
    elsewhere would read an unbounded file and crash on a garbled one."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line in _file_json_parses(ast.parse(path.read_text()))
                 if path.relative_to(PACKAGE).as_posix() != "safe_io/reading.py"]
    assert offenders == []
    assert _file_json_parses(ast.parse("json.loads(p.read_text())\njson.load(f)\njson.loads(line)")) == [1, 2]


def test_the_files_a_run_writes_and_reads_back_are_capped_and_named(tmp_path, monkeypatch):
    from sage_grpo.evaluate import plan as evaluate_plan
    from sage_grpo.evaluate.runner import read_unit
    from sage_grpo.tracking import trackers

    big = {"pad": "x" * (2 << 20)}  # 2 MiB: more than any of these files holds
    (tmp_path / trackers.RUN_IDS_FILE).write_text(json.dumps(big))
    with pytest.raises(ConfigError, match=r"the tracker run ids .*trackers.json is 2\.0 MiB, more than such a file "
                                          r"holds \(1\.0 MiB\); delete it to start new tracker runs"):
        trackers.read_run_ids(tmp_path)
    (tmp_path / trackers.RUN_IDS_FILE).write_text('{"wandb": 7}')
    with pytest.raises(ConfigError, match="not a JSON object of tracker run ids"):
        trackers.read_run_ids(tmp_path)

    plan = SimpleNamespace(output=tmp_path / "eval", settings=lambda: {"steps": 4})
    (plan.output / "cache").mkdir(parents=True)
    (plan.output / "cache" / "settings.json").write_text(json.dumps(big))
    with pytest.raises(ValueError, match=r"settings .*settings.json is 2\.0 MiB, .*use a new --output"):
        evaluate_plan.check_cache_settings(plan)
    (plan.output / "cache" / "settings.json").write_text('{"steps": 8}')
    with pytest.raises(ValueError, match=r"other settings \(differ: steps\)"):
        evaluate_plan.check_cache_settings(plan)

    unit = tmp_path / "unit.json"
    unit.write_text(json.dumps(big))
    monkeypatch.setattr(json, "loads", lambda *_: pytest.fail("parsed an oversized unit record"))
    assert read_unit(unit, {}) == (None, "unreadable (ValueError)")  # sampled again, never parsed

"""The JSON files of a model folder (configs, shard indices) are read as untrusted data: a garbled, oversized, deeply
nested or non-object file is one line naming it, and a shard index cannot point outside its folder."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from sage_grpo import safe_io
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
    monkeypatch.setattr(safe_io, "MAX_JSON_BYTES", 64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pad": "x" * 100}))
    monkeypatch.setattr(safe_io.json, "loads", lambda *_: pytest.fail("parsed an oversized file"))
    with pytest.raises(CheckpointError, match="more than such a file holds"):
        read_json_object(path, "the config")


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

"""Start-up from the meta device (sage_grpo/models/sharded_load.py): the weights read row by row from
single-file and index-sharded safetensors equal from_pretrained's, and a checkpoint that does not fit the model is
refused with every problem named. The sharded (DTensor) path runs in the FSDP tests of test_distributed_trainer.py."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sage_grpo.models import layout
from sage_grpo.models.loading import load_transformer
from sage_grpo.models.sharded_load import INDEX_FILE, SINGLE_FILE, load_sharded_weights, transformer_on_meta
from sage_grpo.safe_io import CheckpointError


def _folder(root):
    return root / layout.transformer_layout("480p_t2v").subdir


@pytest.fixture(scope="module")
def expected(tiny_root):
    return load_transformer(tiny_root, "480p_t2v", torch.float32, "cpu")


def _assert_same(model, expected):
    params = dict(model.named_parameters())
    assert set(params) == {name for name, _ in expected.named_parameters()}
    for name, param in expected.named_parameters():
        assert params[name].dtype == torch.float32 and torch.equal(params[name], param), name


def test_meta_model_loads_like_from_pretrained(tiny_root, expected):
    model = transformer_on_meta(_folder(tiny_root), torch.float32)
    assert all(p.is_meta for p in model.parameters())
    load_sharded_weights(model, _folder(tiny_root), "cpu")
    _assert_same(model, expected)


def test_index_sharded_files(tiny_root, expected, tmp_path):
    state = load_file(str(_folder(tiny_root) / SINGLE_FILE))
    names = sorted(state)
    parts = {"part-1.safetensors": names[::2], "part-2.safetensors": names[1::2]}
    for file, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / file))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {k: f for f, keys in parts.items() for k in keys}}))
    (tmp_path / "config.json").write_text((_folder(tiny_root) / "config.json").read_text())
    model = transformer_on_meta(tmp_path, torch.float32)
    load_sharded_weights(model, tmp_path, "cpu")
    _assert_same(model, expected)


def test_weights_that_do_not_fit_are_refused(tiny_root, tmp_path):
    state = load_file(str(_folder(tiny_root) / SINGLE_FILE))
    missing = sorted(state)[0]
    reshaped = sorted(state)[1]
    state.pop(missing)
    state[reshaped] = torch.zeros(3, 3)
    save_file(state, str(tmp_path / SINGLE_FILE))
    (tmp_path / "config.json").write_text((_folder(tiny_root) / "config.json").read_text())
    model = transformer_on_meta(tmp_path, torch.float32)
    with pytest.raises(CheckpointError, match="do not fit the model") as error:
        load_sharded_weights(model, tmp_path, "cpu")
    assert f"{missing}: not in the weight files" in str(error.value)
    assert f"{reshaped}: (3, 3) in {SINGLE_FILE}" in str(error.value)
    with pytest.raises(CheckpointError, match="neither"):
        load_sharded_weights(model, tmp_path / "nothing", "cpu")

"""The numbers of a model folder's configs are checked when the file is read, before anything is built from it (one
table of structural fields per component, sage_grpo/models/config_fields.py), and weights that cannot fit the machine
are refused with the planner's figure before any model is allocated (sage_grpo/plan/fit.py)."""

import inspect
import json
import re
import shutil

import pytest
from model_fixtures import tiny_args

import sage_grpo.plan.fit as fit
import sage_grpo.startup.build as startup_build
from sage_grpo.cli import generate as generate_cli
from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError
from sage_grpo.models import config_fields
from sage_grpo.models.config_fields import check_config
from sage_grpo.plan.sizes import REAL_BYT5_CONFIG, REAL_REWARD_CONFIG, REAL_TEXT_ENCODER_CONFIG, read_model_sizes
from sage_grpo.safe_io import CheckpointError

FILES = {"transformer": "transformer/480p_t2v/config.json", "vae": "vae/config.json",
         "text_encoder": "text_encoder/config.json", "text_encoder_2": "text_encoder_2/config.json"}
BIG = dict(num_layers=200, num_attention_heads=64, attention_head_dim=128, rope_axes_dim=[16, 56, 56])


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda *args: pytest.fail("models loaded although the input is invalid"))


def root_with(tiny_root, tmp_path, component: str, **changes):
    """A copy of the tiny root whose ``component`` config has ``changes``."""
    root = tmp_path / "root"
    shutil.copytree(tiny_root, root)
    path = root / FILES[component]
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return root, path


def train_refusal(root, tmp_path, capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(root, tmp_path / "run"))
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err[-2000:]
    assert not (tmp_path / "run").exists()
    return err


# ---------------------------------------------------------------- the structural fields

@pytest.mark.parametrize("component,changes,expected", [
    ("transformer", dict(num_layers=200000), "num_layers 200000 must be an integer in [1, 1024]"),
    ("transformer", dict(patch_size=0), "patch_size 0 must be an integer >= 1"),
    ("transformer", dict(num_attention_heads="16"), "num_attention_heads '16' must be an integer >= 1"),
    ("transformer", dict(mlp_ratio=-4.0), "mlp_ratio -4.0 must be a finite number > 0"),
    ("transformer", dict(rope_axes_dim=[2, 2, 2]), "rope_axes_dim [2, 2, 2] must be 3 even sizes (frames, height, "
                                                   "width) summing to attention_head_dim 8"),
    ("vae", dict(spatial_compression_ratio=0), "spatial_compression_ratio 0 must be a power of 2"),
    ("vae", dict(spatial_compression_ratio=-16), "spatial_compression_ratio -16 must be a power of 2"),
    ("vae", dict(temporal_compression_ratio="4"), "temporal_compression_ratio '4' must be a power of 2"),
    ("vae", dict(block_out_channels=[]), "block_out_channels [] must be a list of 1 to 16 integers >= 1"),
    ("text_encoder", dict(num_hidden_layers=0), "num_hidden_layers 0 must be an integer in [1, 1024]"),
    ("text_encoder_2", dict(d_model=-1), "d_model -1 must be an integer >= 1"),
])
def test_a_bad_model_config_is_one_line_before_anything_is_built(tiny_root, tmp_path, capsys, no_models, component,
                                                               changes, expected):
    """200,000 layers were built without bound (3.7 GB and growing after two minutes); ratios of 0 or -16, a string
    where a number belongs and a patch size of 0 ended in tracebacks."""
    root, path = root_with(tiny_root, tmp_path, component, **changes)
    err = train_refusal(root, tmp_path, capsys)
    assert f"{path}: {expected}" in err and "download_weights.sh" in err


def test_generate_reads_the_same_checks(tiny_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    root, path = root_with(tiny_root, tmp_path, "vae", spatial_compression_ratio=-16)
    argv = ["--model_path", str(root), "--prompt", "a cat", "--device", "cpu", "--output_path",
            str(tmp_path / "v.mp4"), "--fixed_size", "16x16", "--video_length", "5", "--dtype", "fp32"]
    assert generate_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}: spatial_compression_ratio -16 must be a power of 2 (1, 2, 4, ...) (the VAE " \
                  "config); download or copy the model folder again (bash download_weights.sh)"


def test_the_loader_checks_before_from_pretrained(tiny_root, tmp_path, monkeypatch):
    from diffusers import HunyuanVideo15Transformer3DModel

    from sage_grpo.models import load_components

    root, path = root_with(tiny_root, tmp_path, "transformer", num_layers=5000)
    monkeypatch.setattr(HunyuanVideo15Transformer3DModel, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("built from a bad config")))
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: num_layers 5000 must be an integer in [1, 1024]")):
        load_components(root)


@pytest.mark.parametrize("section,key,value,expected", [
    ("inference_config", "VQ_std", 0, "inference_config.VQ_std 0 must be a finite number > 0"),
    ("data_config", "max_frame_pixels", "big", "data_config.max_frame_pixels 'big' must be an integer >= 1"),
    ("peft_lora_config", "lora_r", 0, "peft_lora_config.lora_r 0 must be an integer >= 1"),
])
def test_the_videoalign_config_is_checked_when_read(tiny_reward_root, tmp_path, section, key, value, expected):
    from sage_grpo.rewards.videoalign_checkpoint import resolve_checkpoint

    root = tmp_path / "root"
    shutil.copytree(tiny_reward_root, root, symlinks=True)
    path = root / "VideoReward" / "model_config.json"
    data = json.loads(path.read_text())
    data[section][key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {expected} (the VideoAlign config)")):
        resolve_checkpoint(root)


def test_the_reward_base_config_is_checked_when_read(tiny_reward_root, tmp_path):
    from sage_grpo.rewards.videoalign_checkpoint import resolve_checkpoint

    root = tmp_path / "root"
    shutil.copytree(tiny_reward_root, root, symlinks=True)
    base = resolve_checkpoint(root).base_dir / "config.json"
    data = json.loads(base.read_text())
    data["vision_config"]["depth"] = 100000
    base.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=re.escape(f"{base}: vision_config.depth 100000 must be an integer in")):
        resolve_checkpoint(root)


def test_every_table_field_is_one_its_class_takes():
    """The tables name real constructor fields (a typo would check nothing)."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel
    from transformers import Qwen2_5_VLTextConfig, Qwen2VLConfig, SiglipVisionConfig, T5Config

    for table, cls in ((config_fields.TRANSFORMER, HunyuanVideo15Transformer3DModel),
                       (config_fields.VAE, AutoencoderKLHunyuanVideo15)):
        assert set(table) <= set(inspect.signature(cls.__init__).parameters)
    text = {key.rpartition(".")[2] for key in config_fields.TEXT_ENCODER}
    assert all(hasattr(Qwen2_5_VLTextConfig(), key) for key in text)
    assert all(hasattr(T5Config(), key) for key in config_fields.BYT5)
    assert all(hasattr(SiglipVisionConfig(), key) for key in config_fields.IMAGE_ENCODER)
    vision = Qwen2VLConfig().vision_config
    legacy = {"in_chans"}  # the vision config's older spelling of in_channels
    assert all(hasattr(vision, key.split(".")[1]) for key in config_fields.REWARD_BASE
               if key.startswith("vision_config.") and key.split(".")[1] not in legacy)


def test_the_released_and_tiny_configs_pass(tiny_root):
    for component in FILES:
        check_config(json.loads((tiny_root / FILES[component]).read_text()), component, FILES[component])
    for config, component in ((REAL_TEXT_ENCODER_CONFIG, "text_encoder"), (REAL_BYT5_CONFIG, "text_encoder_2"),
                              (REAL_REWARD_CONFIG, "reward_base"), ({}, "transformer"), ({}, "vae")):
        check_config(config, component, "released")


# ---------------------------------------------------------------- weights that cannot fit

def test_weights_larger_than_the_ram_are_refused_with_the_planners_figure(tiny_root, tmp_path, capsys, monkeypatch,
                                                                         no_models):
    monkeypatch.setattr(fit, "host_memory_bytes", lambda: 64 << 30)  # the same answer on every machine
    root, path = root_with(tiny_root, tmp_path, "transformer", **BIG)
    params = read_model_sizes(str(root), "480p_t2v", False).transformer.num_params
    err = train_refusal(root, tmp_path, capsys)
    assert (f"[weights-fit] {path}: num_layers 200, num_attention_heads 64, attention_head_dim 128, mlp_ratio 2.0 give "
            f"the transformer {params / 1e9:.2f}B parameters, {params * 4 / 2 ** 30:.1f} GB in fp32, more than this "
            "machine's 64.0 GB of RAM, which holds it while it loads (the memory planner's count: python -m "
            "sage_grpo.plan). Fix: use the model's released config.json") in err
    assert params > 100e9


def test_a_cpu_run_needs_room_for_every_model_at_once(tiny_root, tmp_path, capsys, monkeypatch, no_models):
    sizes = read_model_sizes(str(tiny_root), "480p_t2v", False)
    largest, total = sizes.transformer.num_params * 4, sum(p for _, p in fit.model_weights(sizes)) * 4
    monkeypatch.setattr(fit, "host_memory_bytes", lambda: (largest + total) // 2)  # each fits, not all
    err = train_refusal(tiny_root, tmp_path, capsys)
    assert "[weights-fit] the models of a CPU run stay in RAM: transformer 0.0 GB" in err
    assert f"the largest: {tiny_root / FILES['transformer']}: num_layers 2, num_attention_heads 2" in err


def test_on_gpus_the_transformer_may_be_sharded_over_the_world(tiny_root):
    sizes = read_model_sizes(str(tiny_root), "480p_t2v", False)
    gpu_gib = sizes.transformer.num_params * 4 / 2 ** 30 / 2  # half the weights
    fit.check_weights_fit(sizes, 4, "cuda", 1 << 40, gpu_gib, shards=2)  # FSDP over 2 ranks: fits
    with pytest.raises(ConfigError, match=r"per GPU over 1 FSDP shard\(s\), more than the GPU's 0\.0 GB"):
        fit.check_weights_fit(sizes, 4, "cuda", 1 << 40, gpu_gib, shards=1)
    fit.check_weights_fit(sizes, 4, "cpu", 1 << 40, None)  # no GPU rule on the CPU


def test_generate_refuses_weights_larger_than_the_ram(tiny_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fit, "host_memory_bytes", lambda: 64 << 30)
    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    root, path = root_with(tiny_root, tmp_path, "transformer", **BIG)
    argv = ["--model_path", str(root), "--prompt", "a cat", "--device", "cpu", "--output_path",
            str(tmp_path / "v.mp4"), "--fixed_size", "16x16", "--video_length", "5", "--dtype", "bf16"]
    assert generate_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: [weights-fit] {path}: num_layers 200") and " GB in bf16, more than" in err


def test_the_evaluation_refuses_weights_larger_than_the_ram(tiny_root, tmp_path, capsys, monkeypatch):
    from sage_grpo.evaluate import main as evaluate_main

    monkeypatch.setattr(fit, "host_memory_bytes", lambda: 64 << 30)
    root, path = root_with(tiny_root, tmp_path, "transformer", **BIG)
    prompts = tmp_path / "eval.csv"
    prompts.write_text("prompt\nA cat walks\n")
    assert evaluate_main(["--checkpoints", "base", "--prompts", str(prompts), "--model_path", str(root), "--metrics",
                          "target_color", "--fixed_size", "16x16", "--video_length", "5", "--device", "cpu",
                          "--output", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: [weights-fit] {path}: num_layers 200") and "\n" not in err
    assert not (tmp_path / "eval").exists()

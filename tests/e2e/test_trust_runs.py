"""Trust end to end: a failed start leaves the earlier run untouched, an always-failing reward stops the run,
resume into a new directory."""
import hashlib
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import sage_grpo.trainer as trainer_module
from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.safe_io import CheckpointError
from sage_grpo.tracking.run_dir import read_metrics
from sage_grpo.trainer import GRPOTrainer

from model_fixtures import tiny_args
from trust_support import write_module


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_failed_start_leaves_the_earlier_run_untouched(tiny_root, tmp_path):
    run = tmp_path / "run"
    GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, run, "--max_steps", "1"))).train()
    before = _snapshot(run)
    assert "checkpoint-1/transformer/model.safetensors" in before and "metrics.jsonl" in before
    broken = tmp_path / "broken_root"  # a copy of the model tree whose transformer weights are truncated
    for source in tiny_root.rglob("*"):
        target = broken / source.relative_to(tiny_root)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            data = source.read_bytes()
            target.write_bytes(data[:100] if source.name == "diffusion_pytorch_model.safetensors"
                               and "transformer" in source.parts[-3:] else data)
    for root, error in ((tmp_path / "typo", trainer_module.MissingCheckpointError), (broken, CheckpointError)):
        with pytest.raises(error):
            GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, run, "--max_steps", "1", "--overwrite_output_dir")))
        assert _snapshot(run) == before


def test_resume_into_a_new_directory_and_without_the_kl(tiny_root, tmp_path):
    first = GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "a", "--max_steps", "2",
                                                         "--update_ref_model_step", "1")))
    first.train()
    checkpoint = first.run_dir / "checkpoint-2"
    assert (checkpoint / "anchor" / "model.safetensors").is_file()
    second = GRPOTrainer(parse_cli(TrainConfig, tiny_args(
        tiny_root, tmp_path / "b", "--max_steps", "3", "--update_ref_model_step", "1", "--kl_weight", "0",
        "--resume_from_checkpoint", str(checkpoint), "--allow_config_change")))
    second.train()
    assert yaml.safe_load((tmp_path / "b" / "run_config.yaml").read_text())["kl_weight"] == 0.0
    changes = yaml.safe_load((tmp_path / "b" / "config_changes.yaml").read_text())
    assert changes[0]["changes"] == {"kl_weight": {"checkpoint": 1e-3, "now": 0.0}}
    assert [r["step"] for r in read_metrics(second.run_dir)] == [3]


def test_a_reward_failing_on_every_sample_is_counted_then_stops_the_run(tiny_root, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "broken_reward", "from sage_grpo.rewards import reward_plugin\n\n"
                 "@reward_plugin\ndef always_fails(videos, prompts):\n    raise RuntimeError('reward server down')\n")
    trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(
        tiny_root, tmp_path / "run", "--max_steps", "5", "--reward_model", "broken_reward:always_fails",
        "--reward_weights", "{}", "--max_failed_reward_steps", "2")))
    with pytest.warns(RuntimeWarning, match="reward server down"):
        with pytest.raises(trainer_module.RewardFailure, match="failed on every sample for 2 consecutive steps"):
            trainer.train()
    rows = read_metrics(trainer.run_dir)
    assert [r["failed_reward_count"] for r in rows] == [2.0, 2.0]
    assert all(r["ratio_mean"] == 1.0 for r in rows)  # advantages 0: nothing to learn, no crash


def test_weights_changed_where_the_fingerprint_does_not_look_stop_the_run_with_nothing_lost(tiny_root, tmp_path):
    """The open case: a model root whose transformer holds NaN outside the fingerprint's sampled blocks is accepted on
    resume (the check does not read those blocks); the KL reference it loads makes every loss NaN.
    Before, that NaN gradient was applied, every checkpoint after the resume held NaN weights and the rewards turned
    NaN; now no update is applied and the run stops after --max_failed_reward_steps steps, the weights as the checkpoint
    left them."""
    from eval_support import linked_root
    from safetensors.torch import load_file

    from sage_grpo.resume import model_fingerprint
    from trust_support import nan_outside_fingerprint

    root = linked_root(tmp_path / "root", tiny_root)
    (root / "transformer").unlink()
    shutil.copytree(tiny_root / "transformer", root / "transformer")
    run = tmp_path / "run"
    fixed_anchor = ("--update_ref_model_step", "100")  # the KL reference stays the root's transformer
    GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, run, "--max_steps", "1", "--save_interval", "1",
                                                 *fixed_anchor))).train()
    before = model_fingerprint(root, "480p_t2v")
    nan_outside_fingerprint(root / "transformer" / "480p_t2v" / "diffusion_pytorch_model.safetensors")
    assert model_fingerprint(root, "480p_t2v") == before  # the cheap check cannot see it ...
    resumed = GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, run, "--max_steps", "5", "--resume_from_checkpoint",
                                                           "latest", "--max_failed_reward_steps", "2", *fixed_anchor)))
    assert any("weights changed in place elsewhere in a file of the same size are not detected" in note
               for note in resumed.notes)  # ... and says so
    with pytest.raises(trainer_module.RewardFailure, match=r"^2 consecutive steps \(steps 2-3\) trained on nothing, "
                                                           r"the last because its loss was nan"):
        resumed.train()
    rows = read_metrics(run)
    assert [(r["step"], r.get("skipped_updates")) for r in rows] == [(1, None), (2, 1.0), (3, 1.0)]
    saved = load_file(run / "checkpoint-1" / "transformer" / "model.safetensors")
    for name, value in resumed.models.trainable_state_dict().items():
        assert torch.equal(value, saved[name]), name  # no NaN gradient reached the weights

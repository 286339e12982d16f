"""The toy world end to end: GRPO raises a toy reward in a few steps; the toy checkpoint writer at a reduced size."""
import json
import math
from pathlib import Path

import pytest
import torch

from toy_support import ON_MANIFOLD_MAX


@pytest.fixture(scope="module")
def reduced_toy(tmp_path_factory):
    """The toy checkpoint writer at a reduced size (a few training steps): the layout, not the learning."""
    from sage_grpo.studies.pretrain import PretrainSettings, write_toy_checkpoint

    root = tmp_path_factory.mktemp("toy") / "toy"
    settings = PretrainSettings(vae_steps=2, vae_batch=2, flow_steps=2, flow_batch=4, flow_dataset=8, eval_samples=2,
                                eval_steps=2)
    return root, write_toy_checkpoint(root, settings)


def test_toy_checkpoint_writer_at_a_reduced_size(reduced_toy):
    from sage_grpo.models.loading import load_components

    root, report = reduced_toy
    assert (root / ".complete").is_file()
    saved = json.loads((root / "toy_report.json").read_text())
    assert set(saved["evaluation"]) == {"true_videos", "vae_reconstructions", "pretrained_samples",
                                        "random_model_samples"}
    assert saved["evaluation"]["true_videos"]["manifold_error_mean"] < ON_MANIFOLD_MAX
    assert math.isfinite(report["losses"]["flow_matching_loss"])
    components = load_components(root, dtype=torch.float32)  # the real loader opens it
    assert components.vae.config.spatial_compression_ratio == 4
    dead = [p for n, p in components.transformer.named_parameters() if n.startswith("context_embedder_2.")]
    assert len(dead) == 8 and all(float(p.detach().abs().max()) == 0 for p in dead)  # stored as zeros
    assert saved["machine"]["threads"] >= 1 and saved["machine"]["cpu"]
    assert components.vae.config.scaling_factor != 1.03682  # set from the trained latents


def test_grpo_raises_a_toy_reward_in_a_few_steps(reduced_toy, tmp_path):
    """post_train.py on the reduced toy checkpoint with the hackable redness reward: fixed seeds, 6 steps, the
    reward's last two steps above its first two (on this barely trained model the trust region is off: the point is
    that the toy reward path trains, not that it stays on the manifold)."""
    import post_train
    from sage_grpo.tracking.run_dir import read_metrics

    root, _ = reduced_toy
    out = tmp_path / "run"
    post_train.main(["--config", "configs/toy_cpu.yaml", "--pretrained_model_root", str(root), "--output_dir",
                     str(out), "--reward_model", "toy_redness", "--reward_weights", '{"toy_redness": 1.0}',
                     "--kl_weight", "0", "--learning_rate", "3e-3", "--max_steps", "6", "--batch_size", "16",
                     "--validation_interval", "0", "--validate_at_step0", "false", "--save_interval", "6",
                     "--save_rollout_videos", "false"])
    rows = read_metrics(out)
    reward = [row["gathered_avg_reward_mean"] for row in rows]
    assert len(rows) == 6 and all("gathered_toy_redness_manifold_error_reward_mean" in row for row in rows)
    assert sum(reward[-2:]) / 2 > sum(reward[:2]) / 2 + 0.01, reward


def test_the_demo_starts_from_the_committed_checkpoints_numbers(tmp_path):
    """The demo (configs/toy_cpu.yaml) on the committed toy checkpoint: its first step's rollouts score what
    docs/demo.md measured under every kernel setting (0.41239 and 0.06830, within 6e-7 of each other there), so the
    checkpoint, the sampler and the reward still give the README's run. A step-1 drift means the README's table and
    docs/demo.md need measuring again."""
    import post_train
    from sage_grpo.studies.committed import COMMITTED, install
    from sage_grpo.tracking.run_dir import read_metrics

    install(tmp_path / "toy", COMMITTED)
    out = tmp_path / "run"
    post_train.main(["--config", "configs/toy_cpu.yaml", "--pretrained_model_root", str(tmp_path / "toy"),
                     "--output_dir", str(out), "--max_steps", "1", "--save_interval", "1",
                     "--validation_interval", "0", "--save_rollout_videos", "false", "--cpu_threads", "1"])
    (row,) = [row for row in read_metrics(out) if "gathered_avg_reward_mean" in row]
    assert row["gathered_avg_reward_mean"] == pytest.approx(0.412385, abs=1e-4)
    assert row["gathered_toy_large_manifold_error_reward_mean"] == pytest.approx(0.068301, abs=1e-5)


def test_a_trained_checkpoint_packs_and_installs_as_the_same_model(reduced_toy, tmp_path, capsys, monkeypatch):
    """--commit_to's packing and --committed's install round trip: the byT5 projection left out of the committed
    form (its recorded shapes only), every other tensor and file as trained; a --commit_to that would record other
    settings than the checkpoint was trained with is refused."""
    import sys

    from safetensors.torch import load_file

    from sage_grpo.studies.committed import WEIGHTS, install, pack

    root, _ = reduced_toy
    packed, installed = tmp_path / "toy_ckpt", tmp_path / "toy"
    record = pack(root, packed, "python scripts/make_toy_checkpoint.py --output x --commit_to y")
    assert set(record["zero_tensors"]) == {n for n in load_file(root / WEIGHTS) if n.startswith("context_embedder_2.")}
    assert not any(n.startswith("context_embedder_2.") for n in load_file(packed / WEIGHTS))
    install(installed, packed)
    trained, back = load_file(root / WEIGHTS), load_file(installed / WEIGHTS)
    assert sorted(trained) == sorted(back) and all(torch.equal(trained[n], back[n]) for n in trained)
    assert (installed / "vae" / "config.json").read_bytes() == (root / "vae" / "config.json").read_bytes()
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    sys.modules.pop("make_toy_checkpoint", None)
    import make_toy_checkpoint

    assert make_toy_checkpoint.main(["--output", str(root), "--commit_to", str(tmp_path / "again")]) == 2
    assert f"error: {root} was trained with other settings" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()
    sys.modules.pop("make_toy_checkpoint", None)

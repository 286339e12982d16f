"""The toy world end to end: GRPO raises a toy reward in a few steps; the toy checkpoint writer at a reduced size."""
import json
import math

import pytest
import torch

from toy_support import ON_MANIFOLD_MAX


@pytest.fixture(scope="module")
def reduced_toy(tmp_path_factory):
    """The toy checkpoint writer at a reduced size (a few training steps): the layout, not the learning."""
    from sage_grpo.toy.pretrain import PretrainSettings, write_toy_checkpoint

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

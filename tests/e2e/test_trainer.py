"""The GRPO trainer end to end on the tiny checkpoint: first-step invariants, exact resume, KL ablations, the
reference's launch flags, and errors raised before any model loads."""

import json

import pytest
import torch
from safetensors.torch import load_file
from launch_flags import RUN_POST_TRAIN_FLAGS
from model_fixtures import tiny_args

import sage_grpo.startup.build as startup_build
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics, validation_rows
from sage_grpo.trainer import GRPOTrainer


# Timings differ run to run; everything else must be bit-identical between a straight run and a resumed one.
TIMING_KEYS = set(TIMING_METRICS)


def make_trainer(root, out_dir, *extra) -> GRPOTrainer:
    return GRPOTrainer(parse_cli(TrainConfig, tiny_args(root, out_dir, *extra)))


def weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.models.policy.named_parameters()}


def test_first_step_is_on_policy_and_updates_every_trained_parameter(tiny_root, tmp_path):
    trainer = make_trainer(tiny_root, tmp_path / "run", "--max_steps", "1")
    before = weights(trainer)
    with_grad = set()
    original_step = trainer.optimizer_step

    def recording_step():
        with_grad.update(n for n, p in trainer.models.policy.named_parameters()
                         if p.grad is not None and bool(p.grad.abs().sum() > 0))
        return original_step()

    trainer.optimizer_step = recording_step
    trainer.train()
    metrics = read_metrics(trainer.run_dir)[0]
    # The policy is unchanged until the update, so rollout and replay log-probs agree exactly: ratio exactly 1,
    # approx_kl = 0.5 * mean((new - old)^2) = 0, step-wise KL = mean(old - new) = 0 and nothing is clipped.
    assert metrics["ratio_mean"] == 1.0
    assert metrics["approx_kl"] == 0.0 and metrics["kl_stepwise"] == 0.0 and metrics["clipfrac"] == 0.0
    after = weights(trainer)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert with_grad and with_grad <= changed  # decoupled weight decay also moves some zero-gradient weights
    # Parameters without a (non-zero) gradient are those the model discards for text-to-video prompts without quoted text:
    # the last block's text-stream output, the (masked) image-embedding tokens and the (masked) glyph stream.
    last = len(trainer.models.policy.transformer_blocks) - 1
    discarded = (f"transformer_blocks.{last}.attn.to_add_out", f"transformer_blocks.{last}.ff_context",
                 "image_embedder.", "context_embedder_2.")
    assert all(n.startswith(discarded) for n in set(before) - changed)
    assert len(with_grad) > 0.75 * len(before)


def _comparable(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def test_resume_continues_exactly(tiny_root, tmp_path):
    straight = make_trainer(tiny_root, tmp_path / "straight", "--max_steps", "4", "--ema_decay", "0.5")
    straight.train()

    first = make_trainer(tiny_root, tmp_path / "split", "--max_steps", "2", "--ema_decay", "0.5")
    first.train()  # saves checkpoint-2 at the end
    assert first.anchor.last_refreshed_at == 2  # the moving anchor moved after update 2, before the checkpoint ...
    resumed = make_trainer(tiny_root, tmp_path / "split", "--max_steps", "4", "--ema_decay", "0.5",
                           "--resume_from_checkpoint", "latest")
    assert resumed.global_step == 0
    resumed.train()
    assert resumed.anchor.last_refreshed_at == straight.anchor.last_refreshed_at == 4

    rows_straight, rows_split = read_metrics(straight.run_dir), read_metrics(resumed.run_dir)
    assert [r["step"] for r in rows_split] == [1, 2, 3, 4]
    assert _comparable(rows_split) == _comparable(rows_straight)
    for name, value in weights(straight).items():
        assert torch.equal(value, weights(resumed)[name]), name
    # ... and its weights were restored from the checkpoint, so the KL terms after the resume match too.
    assert rows_split[2]["kl_moving"] == rows_straight[2]["kl_moving"]
    # the EMA of the weights is restored too: the same average after 4 updates, written whole in checkpoint-4/ema/
    ema = straight.ema.state_dict()
    saved = load_file(str(resumed.run_dir / "checkpoint-4" / "ema" / "model.safetensors"))
    assert set(ema) == set(saved) == set(weights(straight))
    for name, value in ema.items():
        assert torch.equal(value, resumed.ema.state_dict()[name]) and torch.equal(value, saved[name]), name
    assert any(not torch.equal(value, weights(straight)[name]) for name, value in ema.items())  # it lags


@pytest.mark.parametrize("moving,dual,expect_keys,expect_refresh", [
    ("true", "true", {"kl_moving", "kl_stepwise", "kl_loss", "KL_weight"}, True),    # dual moving (default)
    ("false", "true", {"kl_moving", "kl_stepwise", "kl_loss", "KL_weight"}, False),  # dual fixed
    ("true", "false", {"kl_moving", "kl_loss", "KL_weight"}, True),                  # moving
    ("false", "false", {"kl_moving", "kl_loss", "KL_weight"}, False),                # fixed
])
def test_kl_modes(tiny_root, tmp_path, moving, dual, expect_keys, expect_refresh):
    trainer = make_trainer(tiny_root, tmp_path / "run", "--max_steps", "2", "--update_ref_model_step", "1",
                           "--use_moving_KL", moving, "--use_dual_kl", dual)
    trainer.train()
    rows = read_metrics(trainer.run_dir)
    kl_keys = {k for k in rows[-1] if "kl" in k.lower()} - {"approx_kl"}
    assert kl_keys == expect_keys
    assert (trainer.anchor.last_refreshed_at == 2) is expect_refresh  # after updates 1 and 2
    # At step 2 the policy has moved once: the mean-matching KL is positive against the base model (fixed) and
    # exactly 0 right after a refresh (moving anchor = policy).
    assert (rows[-1]["kl_moving"] == 0.0) is expect_refresh


def test_no_kl_loads_no_reference(tiny_root, tmp_path):
    trainer = make_trainer(tiny_root, tmp_path / "run", "--max_steps", "1", "--kl_weight", "0")
    assert trainer.models.reference is None and trainer.kl_controller is None
    trainer.train()
    assert not {k for k in read_metrics(trainer.run_dir)[0] if "kl" in k.lower()} - {"approx_kl"}


def test_reference_launch_flags_run_one_step(tiny_root, tmp_path):
    # run_post_train.sh's flags verbatim, then what one CPU process and the tiny checkpoint need.
    tiny = tiny_args(tiny_root, tmp_path / "run", "--max_steps", "1", "--batch_size", "4", "--num_generations", "4")
    cfg = parse_cli(TrainConfig, RUN_POST_TRAIN_FLAGS + tiny)
    assert cfg.rollout.sde_type == "sage_grpo" and cfg.trust_region.use_moving_KL and cfg.parallel.reference_mode_offload
    trainer = GRPOTrainer(cfg)
    trainer.train()
    rows = read_metrics(trainer.run_dir)
    assert len(rows) == 1 and rows[0]["update_steps"] == 1.0 and rows[0]["ratio_mean"] == 1.0
    assert (trainer.run_dir / "checkpoint-1" / "transformer" / "model.safetensors").exists()


def test_run_directory_contents(tiny_root, tmp_path):
    from eval_support import linked_root

    from sage_grpo.rewards.tiny import write_tiny_clip_scorers

    root = write_tiny_clip_scorers(linked_root(tmp_path / "ckpts", tiny_root), seed=0)  # + tiny CLIP and PickScore
    trainer = make_trainer(root, tmp_path / "run", "--max_steps", "2", "--save_rollout_videos", "true",
                           "--validation_interval", "2", "--validation_fixed_size", "16x16",
                           "--validate_video_length", "5", "--validation_num_inference_steps", "2",
                           "--validation_metrics", "clipscore,pickscore", "--ema_decay", "0.5", "--validate_ema",
                           "--drift_proxy", "true")
    trainer.train()
    run = trainer.run_dir
    assert (run / "run_config.yaml").exists() and any((run / "tb").iterdir())
    assert len(list((run / "samples" / "step_000002").glob("sample_000_seed_930_*.mp4"))) == 1
    # the validation videos scored by the training reward (avg = 1.0 x target_color), the held-out CLIPScore and
    # PickScore and the drift proxy (the base model's denoising error): a row of its own, with the times
    baseline, validation = validation_rows(read_metrics(run))  # the proxy's baseline: the base model's samples
    assert baseline["step"] == 0 and baseline["Validation/drift_proxy"] > 0
    assert validation["step"] == 2 and validation["Validation/avg"] == validation["Validation/target_color"]
    scores = {"Validation/clipscore", "Validation/clip_flowgrpo", "Validation/clip_cosine", "Validation/pickscore",
              "Validation/pickscore_cosine"}
    spreads = {key for key in validation if key.startswith("ValidationSpread/")}  # each score's spread over the videos
    assert spreads == {"ValidationSpread/" + key[len("Validation/"):]
                       for key in scores | {"Validation/avg", "Validation/target_color"}}
    assert scores | {"Validation/drift_proxy", "Validation/drift_proxy_ratio", "Validation/sampling_time",
                     "Validation/reward_time", "Validation/held_out_time", "Validation/drift_proxy_time",
                     "Validation/time"} == set(validation) - {"step", "Validation/avg", "Validation/target_color"} - spreads
    assert validation["Validation/drift_proxy_ratio"] == pytest.approx(
        validation["Validation/drift_proxy"] / baseline["Validation/drift_proxy"], rel=1e-12)
    before = weights(trainer)
    video = trainer.validate(2).samples.samples[0].video  # the same weights (the EMA's) sample the same video
    prompt = trainer.validation_items[0].prompt
    assert validation["Validation/clipscore"] == trainer.held_out(video, prompt)["clipscore"]
    assert all(torch.equal(value, weights(trainer)[name]) for name, value in before.items())  # the policy is back
    policy_video = trainer.validator.run(2, tmp_path / "policy").samples.samples[0].video
    assert not torch.equal(policy_video, video)
    group = json.loads(next((run / "rl_samples" / "0000001" / "group_0").glob("*_rewards.json")).read_text())
    assert len(group) == 2 and {"prompt", "seed", "target_color", "avg", "advantage"} <= set(group[0])
    # two members of one group: advantages are the z-scores, +-1 (or 0 when both rewards are equal)
    assert sorted(round(g["advantage"], 4) for g in group) in ([-1.0, 1.0], [0.0, 0.0])
    assert (run / "checkpoint-2" / "training_state.pt").exists()


@pytest.mark.parametrize("extra,match", [
    (["--train_video_csv", "missing.csv"], "does not exist"),
    (["--sp_size", "2"], "sp-divides-world"),
    (["--batch_size", "3"], "groups-fill-the-step"),
])
def test_errors_before_any_model_loads(tiny_root, tmp_path, monkeypatch, extra, match):
    def no_models(cfg, kl_mode, placement):
        raise AssertionError("models must not load when the configuration is invalid")

    monkeypatch.setattr(startup_build, "build_models", no_models)
    with pytest.raises(ConfigError, match=match):
        make_trainer(tiny_root, tmp_path / "run", *extra)


def test_output_dir_holding_another_run_is_refused(tiny_root, tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run_config.yaml").write_text("seed: 1\n")
    monkeypatch.setattr(startup_build, "build_models", lambda cfg, kl_mode, placement: pytest.fail("models loaded"))
    with pytest.raises(ConfigError, match="already holds a run"):
        make_trainer(tiny_root, tmp_path / "run")

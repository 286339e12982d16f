"""Image-to-video training end to end: the first step is on-policy and trains the image pathway; a mixed run
resumes exactly."""
import json

import torch

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics
from sage_grpo.trainer import GRPOTrainer

from model_fixtures import tiny_args
from i2v_trainer_support import write_i2v_csv


TIMING_KEYS = set(TIMING_METRICS)


def make_trainer(root, out_dir, csv, *extra) -> GRPOTrainer:
    return GRPOTrainer(parse_cli(TrainConfig, tiny_args(
        root, out_dir, "--pretrained_transformer_version", "480p_i2v", "--train_video_csv", str(csv), *extra)))


def test_first_i2v_step_is_on_policy_and_trains_the_image_pathway(tiny_i2v_root, tmp_path):
    csv = write_i2v_csv(tmp_path / "data", [("a red ball rolls", "ball.png"), ("a blue car drives", "car.png")])
    trainer = make_trainer(tiny_i2v_root, tmp_path / "run", csv, "--max_steps", "1", "--valid_video_csv", str(csv),
                           "--validation_interval", "1", "--validation_fixed_size", "16x24",
                           "--validate_video_length", "5", "--validation_num_inference_steps", "2",
                           "--save_rollout_videos", "true")
    conditions = []
    original = trainer._encode
    recording = lambda items, size: conditions.append(original(items, size)) or conditions[-1]  # noqa: E731
    trainer._encode = trainer.validator.encode = recording  # the validator holds the encoder it was built with
    before = {n: p.detach().clone() for n, p in trainer.models.policy.named_parameters()}
    trainer.train()
    metrics = read_metrics(trainer.run_dir)[0]
    assert metrics["ratio_mean"] == 1.0 and metrics["approx_kl"] == 0.0 and metrics["kl_stepwise"] == 0.0
    assert conditions[0].image is not None and conditions[0].image.latents.shape == (2, 4, 1, 2, 2)
    # the SigLIP tokens are valid tokens now, so the image projection learns (it gets no gradient for t2v)
    changed = {n for n, p in trainer.models.policy.named_parameters() if not torch.equal(before[n], p.detach())}
    assert any(n.startswith("image_embedder.") for n in changed)
    records = json.loads(next((trainer.run_dir / "rl_samples").rglob("*_rewards.json")).read_text())
    (image,) = {r["ref_image_path"] for r in records}  # a group shares its prompt's image
    assert len(records) == 2 and image in {str(tmp_path / "data" / "images" / n) for n in ("ball.png", "car.png")}
    # validation samples each image-conditioned row at --validation_fixed_size
    videos = sorted((trainer.run_dir / "samples" / "step_000001").glob("*.mp4"))
    assert len(videos) == 2 and conditions[-1].image.latents.shape == (1, 4, 1, 2, 3)


def test_mixed_i2v_run_resumes_exactly(tiny_i2v_root, tmp_path):
    rows = [("a red ball rolls", "ball.png"), ("a cat walks", ""), ("a blue car drives", "car.png"), ("a dog runs", "")]
    csv = write_i2v_csv(tmp_path / "data", rows)
    straight = make_trainer(tiny_i2v_root, tmp_path / "straight", csv, "--max_steps", "3")
    tasks = []
    original = straight._encode
    straight._encode = lambda items, size: tasks.append(items[0].task) or original(items, size)
    straight.train()
    assert set(tasks) == {"i2v", "t2v"}  # 3 of the epoch's 4 steps (2 of each task): both tasks, one per step

    first = make_trainer(tiny_i2v_root, tmp_path / "split", csv, "--max_steps", "1")
    first.train()
    resumed = make_trainer(tiny_i2v_root, tmp_path / "split", csv, "--max_steps", "3",
                           "--resume_from_checkpoint", "latest")
    resumed.train()
    rows_straight, rows_split = read_metrics(straight.run_dir), read_metrics(resumed.run_dir)
    assert [r["step"] for r in rows_split] == [1, 2, 3]
    strip = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows_straight]
    assert [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows_split] == strip
    for name, value in straight.models.policy.named_parameters():
        assert torch.equal(value, dict(resumed.models.policy.named_parameters())[name]), name

"""Image-to-video GRPO on the tiny ``480p_i2v`` checkpoint: prompt rows with ``ref_image_path`` (relative to the CSV),
task-grouped batches of a mixed CSV, the closest bucket, an on-policy first step that trains the image pathway, an
exact resume, and the errors raised before any model loads."""

import json

import pytest
import torch
from model_fixtures import tiny_args, write_image

from sage_grpo.config import ConfigError, TrainConfig, parse_cli
from sage_grpo.data import GroupedPromptSampler, PromptItem, read_prompt_csvs, video_size
from sage_grpo.tracking.run_dir import read_metrics
from sage_grpo.trainer import GRPOTrainer

TIMING_KEYS = {"rollout_time", "reward_time", "ref_model_time", "grpo_loop_time"}


def _csv(folder, rows):
    """A prompt CSV in ``folder`` whose images sit in ``folder/images`` and are named relative to the CSV."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = ["prompt,seed,ref_image_path"]
    for number, (prompt, image) in enumerate(rows):
        if image:
            write_image(folder / "images" / image, 24, 40, seed=number)
        lines.append(f"{prompt},{10 + number},{'images/' + image if image else ''}")
    path = folder / "prompts.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_trainer(root, out_dir, csv, *extra) -> GRPOTrainer:
    return GRPOTrainer(parse_cli(TrainConfig, tiny_args(
        root, out_dir, "--pretrained_transformer_version", "480p_i2v", "--train_video_csv", str(csv), *extra)))


def test_csv_image_paths_are_relative_to_the_csv_and_checked(tmp_path):
    csv = _csv(tmp_path / "data", [("a red ball", "ball.png"), ("a cat", "")])
    items = read_prompt_csvs([str(csv)])
    assert items[0].ref_image_path == str(tmp_path / "data" / "images" / "ball.png") and items[0].task == "i2v"
    assert items[1].ref_image_path == "" and items[1].task == "t2v"
    (tmp_path / "data" / "broken.png").write_text("not an image")
    bad = tmp_path / "data" / "bad.csv"
    bad.write_text("prompt,ref_image_path\nfine,images/ball.png\noops,broken.png\n")
    with pytest.raises(ConfigError, match=r"bad.csv, row 3: reference image .*broken.png' cannot be read"):
        read_prompt_csvs([str(bad)])


def test_video_size_is_the_closest_bucket_unless_fixed(tmp_path):
    item = PromptItem(0, "p", 1, str(write_image(tmp_path / "portrait.png", 640, 360)))
    assert video_size(item, None, 480, (352, 624)) == (624, 352)   # 9:16 image -> the 9:16 bucket
    assert video_size(item, (16, 16), 480, (352, 624)) == (16, 16)
    assert video_size(PromptItem(1, "q", 1), None, 480, (352, 624)) == (352, 624)


def test_mixed_csv_batches_are_one_task_and_single_task_order_is_unchanged():
    tasks = ["t2v", "i2v", "t2v", "i2v", "i2v", "t2v", "i2v"]   # 3 t2v, 4 i2v
    sampler = GroupedPromptSampler(7, 4, 2, 1, 0, seed=3, tasks=tasks)  # U = 2 prompts per step
    assert sampler.steps_per_epoch == 1 + 2
    for step in range(6):
        batch = sampler.indices(step)
        assert len({tasks[i] for i in batch}) == 1, (step, batch)
    epoch = {i for step in range(3) for i in sampler.indices(step)}
    assert {i for i in epoch if tasks[i] == "i2v"} == {1, 3, 4, 6}  # every i2v prompt once per epoch
    # one task: exactly the order of the sampler without tasks (and of the reference)
    plain, same = GroupedPromptSampler(7, 4, 2, 1, 0, seed=3), GroupedPromptSampler(7, 4, 2, 1, 0, 3, ["i2v"] * 7)
    assert [plain.indices(s) for s in range(6)] == [same.indices(s) for s in range(6)]
    order = torch.randperm(7, generator=torch.Generator().manual_seed(3))
    assert plain.indices(1) == order[2:4].repeat_interleave(2).tolist()


def test_i2v_rows_need_an_i2v_transformer_before_any_model_loads(tiny_root, tmp_path, monkeypatch):
    csv = _csv(tmp_path / "data", [("a red ball", "ball.png")])
    monkeypatch.setattr("sage_grpo.trainer.build_models", lambda *a: pytest.fail("a model was loaded"))
    cfg = parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--train_video_csv", str(csv)))
    with pytest.raises(ConfigError, match="needs an image-to-video transformer.*--pretrained_transformer_version "
                                          "480p_i2v"):
        GRPOTrainer(cfg)


@pytest.mark.e2e
def test_first_i2v_step_is_on_policy_and_trains_the_image_pathway(tiny_i2v_root, tmp_path):
    csv = _csv(tmp_path / "data", [("a red ball rolls", "ball.png"), ("a blue car drives", "car.png")])
    trainer = make_trainer(tiny_i2v_root, tmp_path / "run", csv, "--max_steps", "1", "--valid_video_csv", str(csv),
                           "--validation_interval", "1", "--validation_fixed_size", "16x24",
                           "--validate_video_length", "5", "--validation_num_inference_steps", "2",
                           "--save_rollout_videos", "true")
    conditions = []
    original = trainer._encode
    trainer._encode = lambda items, size: conditions.append(original(items, size)) or conditions[-1]
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


@pytest.mark.e2e
def test_mixed_i2v_run_resumes_exactly(tiny_i2v_root, tmp_path):
    rows = [("a red ball rolls", "ball.png"), ("a cat walks", ""), ("a blue car drives", "car.png"), ("a dog runs", "")]
    csv = _csv(tmp_path / "data", rows)
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

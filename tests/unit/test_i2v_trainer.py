"""Image-to-video GRPO on the tiny ``480p_i2v`` checkpoint: prompt rows with ``ref_image_path`` (relative to the CSV),
task-grouped batches of a mixed CSV, the closest bucket, an on-policy first step that trains the image pathway, an
exact resume, and the errors raised before any model loads."""
import pytest
import torch

from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.data import GroupedPromptSampler, PromptItem, read_prompt_csvs, video_size
from sage_grpo.trainer import GRPOTrainer

from model_fixtures import tiny_args, write_image
from i2v_trainer_support import write_i2v_csv


def test_csv_image_paths_are_relative_to_the_csv_and_checked(tmp_path):
    csv = write_i2v_csv(tmp_path / "data", [("a red ball", "ball.png"), ("a cat", "")])
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
    csv = write_i2v_csv(tmp_path / "data", [("a red ball", "ball.png")])
    monkeypatch.setattr("sage_grpo.startup.build.build_models", lambda *a: pytest.fail("a model was loaded"))
    cfg = parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--train_video_csv", str(csv)))
    with pytest.raises(ConfigError, match="needs an image-to-video transformer.*--pretrained_transformer_version "
                                          "480p_i2v"):
        GRPOTrainer(cfg)

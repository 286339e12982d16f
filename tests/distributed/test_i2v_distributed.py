"""Image-to-video under sequence parallelism: 2 processes with sp 2 (Ulysses, gloo on the CPU) reproduce one process on
an i2v batch of the tiny ``480p_i2v`` checkpoint (the SigLIP tokens ride in the replicated text stream; the condition
channels are split with the latent tokens)."""

import torch
from model_fixtures import tiny_i2v_checkpoint, write_image
from test_distributed_trainer import (LOSS_ATOL, LOSS_KEYS, METRIC_RTOL, TIMING_KEYS, WEIGHT_ATOL, export, run_ok,
                                      tiny_flags)

from sage_grpo.models.loading import load_transformer
from sage_grpo.tracking.run_dir import read_metrics


STEPS = 2


def i2v_flags(root, csv, out_dir, *extra):
    return tiny_flags(root, out_dir, "--pretrained_transformer_version", "480p_i2v", "--train_video_csv", str(csv),
                      "--max_steps", str(STEPS), "--save_interval", str(STEPS), "--update_ref_model_step", "1",
                      "--batch_size", "4", *extra)


def test_sequence_parallel_i2v_matches_one_process(tmp_path_factory, tmp_path):
    root = tiny_i2v_checkpoint(tmp_path_factory)
    write_image(tmp_path / "ball.png", 24, 40, seed=1)
    write_image(tmp_path / "car.png", 40, 24, seed=2)
    csv = tmp_path / "prompts.csv"
    csv.write_text("prompt,seed,ref_image_path\na red ball rolls,3,ball.png\na blue car drives,4,car.png\n")
    run_ok(1, "post_train.py", *i2v_flags(root, csv, tmp_path / "one"))
    run_ok(2, "post_train.py", *i2v_flags(root, csv, tmp_path / "sp2", "--sp_size", "2", "--enable_fsdp", "false"))
    rows, expected = read_metrics(tmp_path / "sp2"), read_metrics(tmp_path / "one")
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    assert expected[0]["ratio_mean"] == 1.0 and expected[1]["kl_moving"] == 0.0  # on-policy; anchor moved at update 1
    for row, ref in zip(rows, expected):
        assert set(row) == set(ref)
        for name in set(ref) - TIMING_KEYS:
            tolerance = LOSS_ATOL if name in LOSS_KEYS else METRIC_RTOL * max(abs(ref[name]), 1e-12)
            assert abs(row[name] - ref[name]) <= tolerance, (row["step"], name, row[name], ref[name])
    weights, ref_weights = export(tmp_path / "sp2", STEPS), export(tmp_path / "one", STEPS)
    assert max((weights[k] - ref_weights[k]).abs().max().item() for k in ref_weights) <= WEIGHT_ATOL
    initial = load_transformer(root, "480p_i2v", torch.float32).state_dict()["image_embedder.linear_1.weight"]
    assert not torch.equal(ref_weights["image_embedder.linear_1.weight"], initial)  # the image pathway trained

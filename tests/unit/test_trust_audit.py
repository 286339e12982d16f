"""The audit's gaps: what a careless or hostile user could still break once the first input checks were in.

Non-finite numbers: a NaN or inf gradient was applied to the weights (a model root whose transformer held NaN
where the resume's sampled fingerprint does not look made every checkpoint after the resume NaN); a NaN video got a
finite reward from a reward that quantises it (remote, mp4), so it never reached the failed-reward count; inf pixels
were clamped to 0 or 1; generate.py wrote NaN videos as black frames, exit 0; NaN weights in a checkpoint were
resumed or exported. Files read back: a LoRA adapter_config.json (NaN alpha, PiSSA rewriting the base weights, DoRA,
an r that allocates gigabytes), metrics.jsonl (plot and model card tracebacks), training_state.pt (a NaN beta, a
garbled RNG state found only after the models loaded), YAML and JSON nested thousands deep or holding integers of
thousands of digits. Writes where the user's data lives: generate.py through an output that links into the model
root, make-tiny over a downloaded model root (its default --output is ckpts/), make_toy_checkpoint.py deleting a
non-toy --output after four minutes of training.

In-process and fast: no model is loaded, except the stand-in modules below.
"""

import json
import math
import random
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from eval_support import linked_root
from safetensors.torch import save_file

from sage_grpo.checkpoint import (CheckpointManager, capture_rng_state, resolve_resume_path,
                                  write_checkpoint_files)
from sage_grpo.config.train import TrainConfig
from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.rewards.base import score_with_fallback
from sage_grpo.rewards.setup import RewardFailure
from sage_grpo.rl import MovingAnchorSchedule
from sage_grpo.safe_io import CheckpointError, load_plain

REPO_ROOT = Path(__file__).resolve().parents[2]


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    return lines[0]


# ---------------------------------------------------------------- a non-finite gradient never reaches the weights

def _trainer(use_muon: bool):
    """What GRPOTrainer.optimizer_step uses of the trainer, over a (4, 3) linear layer."""
    from sage_grpo.optim.optimizers import LRSchedule, build_optimizer

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 4)
    named = list(layer.named_parameters())
    return SimpleNamespace(
        cfg=TrainConfig.of(debug_grad_flow=False, max_grad_norm=1.0, max_grad_norm_units="full", sp_size=1),
        dims=ParallelDims(world_size=1),
        models=SimpleNamespace(trainable_named_parameters=lambda: named), layer=layer,
        optimizer=build_optimizer(named, use_muon=use_muon, lr=0.1, weight_decay=0.01),
        lr_schedule=LRSchedule("constant", 0.1, 0, total_updates=10), update_steps=0, skipped_updates=0, ema=None)


@pytest.mark.parametrize("use_muon", [False, True])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_gradient_is_never_applied(use_muon, bad):
    """Before: clipping scaled every gradient by max_norm / NaN and AdamW wrote NaN into every weight and moment."""
    from sage_grpo.trainer import GRPOTrainer

    trainer = _trainer(use_muon)
    before = {name: p.detach().clone() for name, p in trainer.layer.named_parameters()}
    trainer.layer(torch.ones(2, 3)).sum().backward()
    trainer.layer.weight.grad[0, 0] = bad
    metrics = GRPOTrainer.optimizer_step(trainer)
    for name, param in trainer.layer.named_parameters():
        assert torch.equal(param, before[name]), name  # the weights as they were
        assert param.grad is None
    assert all(not state for state in _optimizer_states(trainer.optimizer))  # no moment was written
    assert not math.isfinite(metrics["grad_norm"]) and trainer.skipped_updates == 1 and trainer.update_steps == 1

    trainer.layer(torch.ones(2, 3)).sum().backward()  # the next finite gradient trains as usual
    GRPOTrainer.optimizer_step(trainer)
    assert trainer.skipped_updates == 1 and not torch.equal(trainer.layer.weight, before["weight"])
    assert all(torch.isfinite(p).all() for p in trainer.layer.parameters())


def _optimizer_states(optimizer):
    parts = getattr(optimizer, "optimizers", None) or [optimizer]
    parts = parts.values() if isinstance(parts, dict) else parts
    return [state for part in parts for state in part.state.values()]


def test_steps_that_train_on_nothing_are_counted_and_stop_the_run():
    from sage_grpo.pipeline.failed_steps import count_failed_step, step_failures

    logged = []
    ok = {"failed_reward_count": 0.0, "total_loss": 0.1, "grad_norm": 0.5}  # skipped_updates: logged when > 0
    nan_loss = {**ok, "total_loss": math.nan, "skipped_updates": 1.0, "grad_norm": math.nan}
    assert step_failures(ok, 2) == []
    streak = count_failed_step(0, 1, step_failures(nan_loss, 2), 3, logged.append)
    streak = count_failed_step(streak, 2, step_failures(nan_loss, 2), 3, logged.append)
    assert streak == 2 and logged[-1] == ("warning: step 2 trained on nothing (2 step(s) in a row): its loss was nan, "
                                          "so its gradient was not applied (weights and optimizer state unchanged)")
    assert count_failed_step(streak, 3, step_failures(ok, 2), 3, logged.append) == 0  # a step that trained resets
    overflow = {**ok, "skipped_updates": 1.0, "grad_norm": math.inf}  # a finite loss whose gradient overflowed
    assert step_failures(overflow, 2) == ["its gradient norm was inf, so its gradient was not applied (weights and "
                                          "optimizer state unchanged)"]
    streak = 0
    for step in (4, 5):
        streak = count_failed_step(streak, step, step_failures(nan_loss, 2), 3, logged.append)
    with pytest.raises(RewardFailure, match=r"^3 consecutive steps \(steps 4-6\) trained on nothing, the last because "
                                            r"the reward failed on every sample \(its advantages are 0\); its loss "
                                            r"was nan.*weights holding NaN or inf .*--max_failed_reward_steps"):
        count_failed_step(streak, 6, step_failures({**nan_loss, "failed_reward_count": 2.0}, 2), 3, logged.append)
    with pytest.raises(RewardFailure, match=r"^the reward failed on every sample for 1 consecutive steps"):
        count_failed_step(0, 7, step_failures({**ok, "failed_reward_count": 2.0}, 2), 1, logged.append)
    assert count_failed_step(99, 8, step_failures(nan_loss, 2), 0, logged.append) == 100  # 0: never stop


# ---------------------------------------------------------------- non-finite videos

def _always_one(calls):
    def reward(videos, prompts):  # like a remote or mp4 reward: NaN pixels become 0 and score like any video
        calls.append(list(prompts))
        return {"score": torch.ones(len(prompts))}
    return reward


def test_a_non_finite_video_is_failed_without_being_scored():
    calls = []
    videos = torch.rand(4, 3, 2, 4, 4)
    videos[1, 0, 0, 0, 0] = math.nan
    videos[3] = math.inf
    with pytest.warns(RuntimeWarning) as caught:
        scores = score_with_fallback(_always_one(calls), videos, ["a", "b", "c", "d"], name="quantised", batch_size=2)
    assert calls == [["a", "c"]]  # the finite videos, in chunks of 2
    assert torch.equal(scores["score"].isnan(), torch.tensor([False, True, False, True]))
    assert [str(w.message) for w in caught] == [
        f"reward 'quantised' gave NaN for prompt '{p}': its video is not finite (NaN or inf pixels), so it is not "
        "scored" for p in "bd"]
    assert score_with_fallback(_always_one([]), videos[:1].to(torch.uint8), ["a"], name="u8")["score"].item() == 1.0


class _StandInVAE(torch.nn.Module):
    dtype = torch.float32
    config = SimpleNamespace(scaling_factor=1.0)

    def decode(self, latents, return_dict=False):
        return (latents.repeat(1, 3, 1, 1, 1) * 4.0,)


def test_decoded_pixels_that_overflow_stay_nan():
    """Before: clamp(0, 1) turned inf into 1 and -inf into 0, a finite video from a broken sample."""
    from sage_grpo.models.vae import decode_latents

    latents = torch.tensor([0.0, 0.1, math.inf, -math.inf, math.nan]).view(1, 1, 1, 1, 5)
    video = decode_latents(_StandInVAE(), latents)
    assert video.shape == (1, 3, 1, 1, 5)
    assert torch.equal(video[0, :, 0, 0, :2], torch.tensor([[0.0, 0.1]] * 3) * 4 / 2 + 0.5)
    assert video[..., 2:].isnan().all()


def test_generate_refuses_to_write_a_non_finite_video(tiny_root, tmp_path, monkeypatch, capsys):
    """Before: a checkpoint holding NaN sampled NaN videos that were written as black frames, exit 0."""
    from sage_grpo.cli.generate import main
    from sage_grpo.pipeline import generation

    class NaNGenerator:
        def __init__(self, config, plan):
            pass

        def render(self, item, progress=False):
            return torch.full((3, 5, 16, 16), math.nan)

    monkeypatch.setattr(generation, "VideoGenerator", NaNGenerator)
    output = tmp_path / "out.mp4"
    assert main(["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu", "--fixed_size", "16x16",
                 "--video_length", "5", "--output_path", str(output)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (f"error: the video of prompt 'a cat' (seed 930) is not finite (NaN or inf pixels), so it is not "
                    f"written to {output}: the weights hold NaN or inf (--model_path {tiny_root}), or the settings "
                    "overflow the model's range")
    assert not output.exists()


# ---------------------------------------------------------------- weights holding NaN are never loaded as good

class _StandInModels:
    def __init__(self):
        self.policy, self.reference = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2).requires_grad_(False)

    def load_trainable_state_dict(self, state):
        self.policy.load_state_dict(state)

    def load_reference_state(self, state):
        self.reference.load_state_dict(state)


@pytest.mark.parametrize("part", ["weights", "optimizer"])
def test_a_checkpoint_holding_nan_is_refused_when_resumed(tmp_path, part):
    """Before: resumed, its rewards were NaN and the run went on until the failed-reward stop, every checkpoint NaN."""
    models = _StandInModels()
    weights = {k: v.detach().clone() for k, v in models.policy.state_dict().items()}
    optimizer = torch.optim.AdamW(models.policy.parameters())
    models.policy(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    optimizer_state = optimizer.state_dict()
    (weights if part == "weights" else optimizer_state["state"][0])["bias" if part == "weights" else "exp_avg"][0] = \
        math.nan
    path = tmp_path / "checkpoint-2"
    training = {"global_step": 2, "update_steps": 2, "micro_steps": 2, "kl_controller": None,
                "anchor_schedule": {"last_refreshed_at": None}, "rng": capture_rng_state()}
    write_checkpoint_files(path, model_state=weights, training_state=training, optimizer_state=optimizer_state)
    manager = CheckpointManager(
        models=models, optimizer=optimizer, kl_controller=None, anchor_schedule=MovingAnchorSchedule(False, 2),
        counters=SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda s: None),
        dims=ParallelDims(world_size=1), run_dir=tmp_path, keep_checkpoints=0, layout={}, config_yaml=lambda: "",
        log=print)
    file, name = ("transformer/model.safetensors", "bias") if part == "weights" else ("optimizer.pt", "state.0.exp_avg")
    with pytest.raises(CheckpointError, match=re.escape(f"{path / file}: {name} holds NaN or inf values")):
        manager.load(resolve_resume_path("latest", tmp_path), load_plain(path / "training_state.pt", "state"))


def test_export_refuses_weights_holding_nan(tiny_root, tmp_path):
    from sage_grpo.export.weights import export_checkpoint
    from sage_grpo.models import load_transformer

    state = load_transformer(tiny_root, dtype=torch.float32).state_dict()
    state["proj_out.weight"][0, 0] = math.inf
    save_file(state, tmp_path / "weights.safetensors")
    with pytest.raises(CheckpointError, match="proj_out.weight holds NaN or inf values"):
        export_checkpoint(tmp_path / "weights.safetensors", tiny_root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- LoRA adapter configs read back

def _adapter(folder: Path, rank: int = 4, **changes) -> Path:
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": "to_q",
              "init_lora_weights": True, "use_dora": False, "modules_to_save": None, "rank_pattern": {},
              "alpha_pattern": {}, "bias": "none", **changes}
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file({"base_model.model.blocks.0.to_q.lora_A.weight": torch.zeros(rank, 8),
               "base_model.model.blocks.0.to_q.lora_B.weight": torch.zeros(8, rank)},
              folder / "adapter_model.safetensors")
    return folder


@pytest.mark.parametrize("changes,match", [
    ({"lora_alpha": math.nan}, "lora_alpha must be a number > 0 and < 1e300, got 'nan'"),  # sampled black videos
    ({"lora_alpha": 0}, "lora_alpha must be a number > 0"),
    ({"r": 10**9}, "r is 1000000000 but the lora_A tensors of adapter_model.safetensors have rank [4]"),
    ({"r": -1}, "r must be a positive integer, got '-1'"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights must be true, false or 'gaussian' (other initialisations "
                                     "rewrite the base weights)"),
    ({"use_dora": True}, "use_dora must be unset (sage-grpo reads plain LoRA adapters)"),
    ({"modules_to_save": ["proj_out"]}, "modules_to_save must be unset"),
    ({"rank_pattern": {"to_q": 64}}, "rank_pattern must be unset"),
    ({"peft_type": "LOHA"}, "peft_type must be 'LORA'"),
    ({"lora_dropout": 1.5}, "lora_dropout must be a number in [0, 1)"),
    ({"target_modules": 5}, "target_modules must be a regex or a list of module names"),
    ({"target_modules": "(to_q"}, "target_modules is not a valid regex"),
])
def test_a_crafted_adapter_config_is_one_line_before_any_model_loads(tmp_path, changes, match):
    from sage_grpo.export.weights import locate_trained_weights

    folder = _adapter(tmp_path / "lora", **changes)
    with pytest.raises(CheckpointError, match=re.escape(f"{folder / 'adapter_config.json'}: {match}")):
        locate_trained_weights(folder)  # generate.py's and the evaluation's check, before the models load


def test_adapter_files_that_are_not_lora_settings_or_hold_nan(tmp_path):
    from sage_grpo.models.lora_folder import check_adapter_folder, read_adapter_folder

    assert check_adapter_folder(_adapter(tmp_path / "ok"))["r"] == 4
    folder = _adapter(tmp_path / "deep")
    (folder / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="cannot read the LoRA adapter config .*adapter_config.json: .*recursion"):
        check_adapter_folder(folder)
    folder = _adapter(tmp_path / "nan")
    save_file({"base_model.model.blocks.0.to_q.lora_A.weight": torch.full((4, 8), math.nan),
               "base_model.model.blocks.0.to_q.lora_B.weight": torch.zeros(8, 4)},
              folder / "adapter_model.safetensors")
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors: blocks.0.to_q.lora_A.weight holds NaN"):
        read_adapter_folder(folder)



def test_an_adapter_that_does_not_fit_the_transformer_is_one_line(tiny_root, tmp_path):
    """Before: peft's NoMatchingPeftModuleError (target_modules matching no layer) or a KeyError was a traceback."""
    from sage_grpo.export.weights import TrainedWeights, apply_trained_weights
    from sage_grpo.models import load_transformer, lora

    transformer = load_transformer(tiny_root, dtype=torch.float32)
    weights = TrainedWeights("lora", {}, tmp_path / "lora", lora.make_lora_config(4, 8, 0.0, ["no_such_layer"]))
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'lora'}: the LoRA adapter does not fit this "
                                                        "transformer (Target modules {'no_such_layer'} not found")):
        apply_trained_weights(transformer, weights)

# ---------------------------------------------------------------- metrics.jsonl read back: plot, model card, resume

CRAFTED_ROWS = [
    '{"step": 1, "gathered_avg_reward_mean": "x", "gathered_avg_reward_std": [1], "kl_loss": {"a": 1}}',
    '{"step": 2}',
    '{"step": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # RecursionError in json.loads
    '{"step": 4' + "0" * 5000 + "}",  # more digits than int() converts: a ValueError, not a JSONDecodeError
    '{"step": true, "gathered_avg_reward_mean": 0.5}',
    '{"step": 5, "gathered_avg_reward_mean": 1e308, "gathered_avg_reward_std": Infinity}',
    '{"step": 6, "gathered_avg_reward_mean": 1e308, "gathered_t_manifold_error_reward_mean": "q"}',
    '{"step": 7, "gathered_avg_reward_mean": 1' + "0" * 400 + ', "gathered_x_reward_mean": 1' + "0" * 400 + "}",
    '{"step": 7, "Validation/avg": "x", "Validation/clipscore": [1]}',  # a validation row
]


def test_crafted_metric_rows_are_dropped_or_ignored_by_every_reader(tmp_path, capsys):
    """Before: sage-grpo plot gave a TypeError, KeyError or RecursionError traceback, the model card an
    OverflowError (fsum of 1e308s; an integer beyond the float range), a resume's metrics rewrite the same."""
    from sage_grpo.cli.plot import main as plot
    from sage_grpo.export.model_card import model_card
    from sage_grpo.tracking.run_dir import read_metrics, truncate_metrics

    (tmp_path / "metrics.jsonl").write_text("\n".join(CRAFTED_ROWS) + "\n")
    with pytest.warns(RuntimeWarning) as caught:
        rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 5, 6, 7, 7]
    assert [re.search(r"line (\d+)", str(w.message)).group(1) for w in caught] == ["3", "4", "5"]
    with pytest.warns(RuntimeWarning):
        assert plot([str(tmp_path)]) == 0 and (tmp_path / "run.png").is_file()
        card = model_card(tmp_path / "checkpoint-7", export_format="transformer", dtype="fp32", merged_lora=False,
                          run_config={})
    assert capsys.readouterr().out == f"wrote {tmp_path / 'run.png'}\n"
    assert "- steps logged: 2\n- GRPO reward (`gathered_avg_reward_mean`), mean of the first 1 steps: " in card
    with pytest.warns(RuntimeWarning):
        truncate_metrics(tmp_path, 6)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 5, 6]


# ---------------------------------------------------------------- training_state.pt read back

def _training_state(**changes):
    state = {"global_step": 2, "update_steps": 2, "micro_steps": 2, "failed_reward_steps": 0,
             "kl_controller": {"kl_coef": 1e-4, "num_updates": 4, "history": [0.0, 0.1]},
             "anchor_schedule": {"last_refreshed_at": None}, "layout": {"videos_per_step": 2},
             "rng": capture_rng_state()}
    for key, value in changes.items():
        owner, _, name = key.partition(".")
        if name:
            state[owner] = {**state[owner], name: value}
        else:
            state[owner] = value
    return state


@pytest.mark.parametrize("changes,match", [
    ({"kl_controller.kl_coef": math.nan}, "kl_controller.kl_coef must be a finite number >= 0, got nan"),
    ({"kl_controller.kl_coef": "0.1"}, "kl_controller.kl_coef must be a finite number >= 0, got '0.1'"),
    ({"kl_controller.num_updates": -7}, "kl_controller.num_updates must be a non-negative integer, got -7"),
    ({"kl_controller.history": "abc"}, "kl_controller.history must be a list of numbers, got 'abc'"),
    ({"anchor_schedule.last_refreshed_at": "x"}, "anchor_schedule.last_refreshed_at must be empty or a "
                                                 "non-negative integer, got 'x'"),
    ({"anchor_schedule": {}}, "anchor_schedule must be a mapping with last_refreshed_at"),
    ({"rng.torch": torch.zeros(3, dtype=torch.uint8)}, r"rng is not a saved RNG state \(RuntimeError: "),
    ({"rng.python": (3, (1, 2), None)}, r"rng is not a saved RNG state \(ValueError: state vector is the wrong "
                                        "size"),
    ({"rng_per_rank": 5}, None),
])
def test_a_crafted_training_state_is_one_line_before_any_model_loads(tmp_path, changes, match):
    """Before: a NaN beta made every loss NaN and the weights NaN; a garbled RNG state or controller history gave a
    traceback after the models had loaded."""
    from sage_grpo.resume import check_training_state

    state = _training_state(**changes)
    if match is None:  # several processes' RNG states
        del state["rng"]
        match = "rng_per_rank must be a list of RNG states, got 5"
    with pytest.raises(CheckpointError, match=rf"training_state.pt: {match}"):
        check_training_state(state, tmp_path / "training_state.pt")
    check_training_state(_training_state(), tmp_path / "training_state.pt")  # a real one passes
    random.random(), np.random.rand(), torch.rand(1)  # the global RNGs untouched by the check


# ---------------------------------------------------------------- YAML and JSON nested thousands deep, huge integers

def test_deep_or_huge_values_in_files_read_back_are_one_line(tmp_path):
    """Before: a RecursionError traceback (--config, a checkpoint's config.yaml), a ValueError traceback (an integer of
    thousands of digits in trackers.json, weights.lock.json, sampling.json, the evaluation's settings.json)."""
    from sage_grpo.config import ConfigError
    from sage_grpo.config.reward_weights import parse_reward_weights
    from sage_grpo.config.schema import load_yaml
    from sage_grpo.export.pipeline import read_sampling_record
    from sage_grpo.models.revisions import read_lock
    from sage_grpo.tracking.trackers import read_run_ids

    deep = tmp_path / "deep.yaml"
    deep.write_text("reward_kwargs: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ValueError, match=f"^--config {deep}: nested too deeply to be a configuration$"):
        load_yaml(str(deep))
    with pytest.raises(ValueError, match=r"^reward_weights is not valid JSON \(maximum recursion depth exceeded"):
        parse_reward_weights('{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    huge = '{"a": 1' + "0" * 5000 + "}"
    for name, read, error in (("trackers.json", lambda: read_run_ids(tmp_path), ConfigError),
                              ("weights.lock.json", lambda: read_lock(tmp_path / "weights.lock.json"), ValueError),
                              ("sampling.json", lambda: read_sampling_record(tmp_path), ValueError)):
        (tmp_path / name).write_text(huge)
        with pytest.raises(error, match=re.escape(str(tmp_path / name))):
            read()


# ---------------------------------------------------------------- writes where the user's data lives

def test_generate_refuses_an_output_that_links_into_an_input(tiny_root, tmp_path, capsys):
    """Before: generate.py wrote the mp4 through the link, over the model root's VAE weights."""
    from sage_grpo.cli.generate import main

    root = linked_root(tmp_path / "root", tiny_root)
    (root / "vae").unlink()
    shutil.copytree(tiny_root / "vae", root / "vae")  # this test's own copy: the shared fixture stays intact
    target = next((root / "vae").glob("*.safetensors"))
    before = target.read_bytes()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "video.mp4").symlink_to(target)
    assert main(["--model_path", str(root), "--prompt", "a cat", "--device", "cpu", "--fixed_size", "16x16",
                 "--video_length", "5", "--output_path", str(tmp_path / "out" / "video.mp4")]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: --output_path {tmp_path / 'out' / 'video.mp4'} lies inside --model_path {root}: the command "
        f"would write into what it reads. Choose an --output_path outside {root}")
    assert target.read_bytes() == before


def test_make_tiny_refuses_a_model_root_it_did_not_write(tmp_path, capsys, monkeypatch):
    """Before: `sage-grpo make-tiny` (default --output ckpts, where download_weights.sh puts the real weights)
    replaced the downloaded VAE, encoders and scheduler with random tiny ones."""
    from sage_grpo.cli import make_tiny

    monkeypatch.setattr(make_tiny, "write_tiny_hunyuan", lambda *a, **k: pytest.fail("wrote over the model root"))
    root = tmp_path / "ckpts"
    (root / "vae").mkdir(parents=True)
    (root / "vae" / "config.json").write_text("{}")
    assert make_tiny.main(["--output", str(root)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: --output {root} already holds a model that make-tiny did not write (vae): its weights would be "
        "replaced by random ones. Choose a new folder, e.g. --output ckpts/tiny")
    assert sorted(p.name for p in root.iterdir()) == ["vae"]
    make_tiny.check_output(REPO_ROOT / "ckpts")  # a fresh clone's ckpts/ (its README only) is still the default
    (root / make_tiny.MARKER).touch()
    make_tiny.check_output(root)  # a root make-tiny wrote is written again


def test_make_toy_checkpoint_refuses_to_replace_what_is_not_a_toy_checkpoint(tmp_path, capsys, monkeypatch):
    """Before: --output ckpts (a typo for ckpts/toy) trained for four minutes, then deleted the whole folder."""
    import sage_grpo.studies.pretrain as pretrain

    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    monkeypatch.setattr(pretrain, "write_toy_checkpoint", lambda *a, **k: pytest.fail("trained before refusing"))
    sys.modules.pop("make_toy_checkpoint", None)
    import make_toy_checkpoint

    (tmp_path / "ckpts" / "vae").mkdir(parents=True)
    assert make_toy_checkpoint.main(["--output", str(tmp_path / "ckpts")]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"error: --output {tmp_path / 'ckpts'} exists and is not a "
                                                         "toy checkpoint (no .complete); it would be deleted")
    assert (tmp_path / "ckpts" / "vae").is_dir()
    sys.modules.pop("make_toy_checkpoint", None)


def test_seeds_beyond_the_generators_range_are_refused_before_any_model_loads(tiny_root, tmp_path):
    """Before: torch's generators refused them ("Overflow when unpacking long long") after the models had loaded."""
    from model_fixtures import tiny_args

    from sage_grpo.config import ConfigError, parse_cli
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.config.generate import GenerateConfig
    from sage_grpo.config.validation import check_option_values
    from sage_grpo.data import read_prompt_csvs
    from sage_grpo.pipeline.generation import plan_generation

    (tmp_path / "p.csv").write_text(f"prompt,seed\na cat,{2**64}\n")
    with pytest.raises(ConfigError, match=rf"p.csv'?, row 2: seed {2**64} must be in \[0, 2\*\*63\)$"):
        read_prompt_csvs([str(tmp_path / "p.csv")])
    with pytest.raises(ConfigError, match=rf"^\[seed-range\] --seed {2**64} must be in \[0, 2\*\*63\)"):
        plan_generation(GenerateConfig(model_path=str(tiny_root), prompt="a cat", seed=2**64, device="cpu"))
    with pytest.raises(ConfigError, match=r"^\[validation_global_seed-range\] --validation_global_seed -1 must be"):
        check_option_values(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run",
                                                             "--validation_global_seed", "-1")))

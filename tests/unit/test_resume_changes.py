"""What a resume may change, decided before any model loads, and what run_config.yaml then says.

* Other training prompts (their content, wherever the files now are) and other text-stream lengths define another
  run: refused like the other run-defining settings, recorded when --allow_config_change allows them (before: taken
  without a word while run_config.yaml kept the old values).
* run_config.yaml holds every value the resumed run uses, the freely changed ones (max_steps, ...) included.
* A change that leaves the checkpoint's tensors unloadable (LoRA or not, the adapter's rank or target modules, a
  transformer of other shapes) is refused in one line naming both values, --allow_config_change or not (before: a
  KeyError after every model had loaded). LoRA alpha shapes no tensor and may change like any allowed setting.

The checkpoints are written as the trainer writes them, with stand-in tensors of the shapes that matter.
"""

from pathlib import Path

import pytest
import torch
import yaml
from model_fixtures import tiny_args
from trust_support import write_checkpoint_two

import sage_grpo.startup.build as startup_build
import sage_grpo.trainer as trainer_module
from sage_grpo.cli.train import main as train_main
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.resume import CONFIG_CHANGES_FILE
from sage_grpo.startup import resolve
from sage_grpo.startup.run_files import take_run_dir

pytestmark = pytest.mark.unit
LORA = ["--use_lora", "true", "--lora_r", "4", "--lora_alpha", "8"]
ADAPTER = {"transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 32),
           "transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(32, 4)}


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda cfg, kl_mode, placement: pytest.fail("models loaded"))


def _prompts(path: Path, *rows: str) -> str:
    path.write_text("prompt\n" + "\n".join(rows) + "\n")
    return str(path)


def _preflight_passes(args) -> None:
    with pytest.raises(pytest.fail.Exception, match="models loaded"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args))


def test_other_prompts_or_text_lengths_are_run_defining(tiny_root, tmp_path, no_models):
    first = _prompts(tmp_path / "train.csv", "a red disk", "a blue square")
    args = tiny_args(tiny_root, tmp_path / "run", "--train_video_csv", first)
    resume = ["--resume_from_checkpoint", str(write_checkpoint_two(args, {"w": torch.ones(2)}))]
    other = _prompts(tmp_path / "other.csv", "a red disk", "a blue square", "a green ring")
    with pytest.raises(ConfigError, match=r"prompt data --train_video_csv \(other rows: 2 -> 3 prompts\) "
                                          r"\['.*/train.csv'\] -> \['.*/other.csv'\]"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--train_video_csv", other]))
    edited = _prompts(tmp_path / "edited.csv", "a red disk", "a blue circle")  # as many rows, one edited
    with pytest.raises(ConfigError, match=r"other rows: 2 -> 2 prompts"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--train_video_csv", edited]))
    with pytest.raises(ConfigError, match=r"--text_max_length 16 -> 24"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--text_max_length", "24"]))
    moved = tmp_path / "moved" / "train.csv"  # the same rows elsewhere: the same run
    moved.parent.mkdir()
    moved.write_text(Path(first).read_text())
    _preflight_passes(args + resume + ["--train_video_csv", str(moved)])
    _preflight_passes(args + resume + ["--train_video_csv", other, "--allow_config_change"])

    older = tmp_path / "older"  # a checkpoint of an earlier version records no prompts: the paths are compared
    older_args = tiny_args(tiny_root, older, "--train_video_csv", first)
    older_resume = ["--resume_from_checkpoint", str(write_checkpoint_two(older_args, {"w": torch.ones(2)},
                                                                record_prompts=False))]
    with pytest.raises(ConfigError, match=r"--train_video_csv \['.*/train.csv'\] -> \['.*/moved/train.csv'\]"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, older_args + older_resume + ["--train_video_csv",
                                                                                       str(moved)]))


def test_run_config_holds_what_the_resumed_run_uses(tiny_root, tmp_path):
    first = _prompts(tmp_path / "train.csv", "a red disk", "a blue square")
    args = tiny_args(tiny_root, tmp_path / "run", "--train_video_csv", first, "--max_steps", "2")
    resume = ["--resume_from_checkpoint", str(write_checkpoint_two(args, {"w": torch.ones(2)}))]
    other = _prompts(tmp_path / "other.csv", "a green ring", "a white cross")
    for extra, recorded in ((["--max_steps", "5", "--log_interval", "3"], {}),  # free: no config_changes entry
                            (["--max_steps", "6", "--train_video_csv", other, "--allow_config_change"],
                             {"prompt data --train_video_csv (other rows: 2 -> 2 prompts)": {
                                 "checkpoint": [first], "now": [other]}})):
        cfg = parse_cli(TrainConfig, args + resume + extra)
        start = resolve(cfg)  # the trainer's start-up: what the run writes once its models have loaded
        check = start.plan.resume.check
        run_dir = take_run_dir(start.cfg, start.plan, start.run_claim, [])
        written = yaml.safe_load((run_dir / "run_config.yaml").read_text())
        assert {key: written[key] for key in ("max_steps", "log_interval", "train_video_csv")} == \
            {"max_steps": cfg.optim.max_steps, "log_interval": cfg.output.log_interval, "train_video_csv": cfg.data.train_video_csv}
        changes = run_dir / CONFIG_CHANGES_FILE
        assert (yaml.safe_load(changes.read_text())[-1]["changes"] if changes.exists() else {}) == recorded
    assert any("step 3 takes its prompts where that step number falls in the new prompts' shuffled order" in note
               for note in check.notes)


def test_a_lora_rank_that_cannot_load_is_refused_in_one_line(tiny_root, tmp_path, no_models, capsys):
    args = tiny_args(tiny_root, tmp_path / "run", *LORA)
    path = write_checkpoint_two(args, ADAPTER)
    resume = ["--resume_from_checkpoint", str(path), "--allow_config_change"]
    with pytest.raises(SystemExit) as stop:  # before: a KeyError traceback once every model had loaded
        train_main(args + resume + ["--lora_r", "8"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: resuming {path} with LoRA rank 8 (--lora_r 8): its adapter has rank 4, and an adapter's "
                   "shapes cannot change (tensors of other shapes cannot load, not even with --allow_config_change). "
                   f"Resume with --lora_r 4, or start a new run from this adapter: --pretrained_lora_path {path}/lora")


def test_changes_that_leave_the_tensors_unloadable_are_refused(tiny_root, other_root, tmp_path, no_models):
    args = tiny_args(tiny_root, tmp_path / "run", *LORA)
    resume = ["--resume_from_checkpoint", str(write_checkpoint_two(args, ADAPTER)), "--allow_config_change"]
    with pytest.raises(ConfigError, match=r"with --lora_target_modules \['to_k'\]: its adapter adapts the layers "
                                          r"of None, and its tensors cannot move to other layers"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--lora_target_modules", "to_k"]))
    with pytest.raises(ConfigError, match=r"with --use_lora False: it holds a LoRA adapter \(tensors of other "
                                          r"shapes cannot load, not even with --allow_config_change\)"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, args + resume + ["--use_lora", "false"]))
    _preflight_passes(args + resume + ["--lora_alpha", "32"])  # a scale, not a shape: allowed

    full = tiny_args(tiny_root, tmp_path / "full")  # full weights, one of them of another transformer's shape
    from sage_grpo.export.identity import transformer_shapes

    shapes = transformer_shapes(tiny_root, "480p_t2v", parameters_only=True)
    weights = {name: torch.zeros(shape) for name, shape in shapes.items()}
    weights["proj_out.weight"] = torch.zeros(3, 3)
    resume = ["--resume_from_checkpoint", str(write_checkpoint_two(full, weights)), "--allow_config_change"]
    with pytest.raises(ConfigError, match=r"with another model root --pretrained_model_root \(differs in .*\): its "
                                          r"trainable weights do not fit the transformer 480p_t2v of .*mis-shaped "
                                          r"keys \(1\): proj_out.weight"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, full + resume + ["--pretrained_model_root",
                                                                           str(other_root)]))
    with pytest.raises(ConfigError, match=r"with --use_lora True: it holds full transformer weights"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, full + resume + LORA))


@pytest.fixture(scope="module")
def other_root(tmp_path_factory) -> Path:
    """A second tiny model root: the same shapes and configs as tiny_root, other weights (seed 1)."""
    from sage_grpo.models import write_tiny_hunyuan

    root = tmp_path_factory.mktemp("other_tiny_root")
    write_tiny_hunyuan(root, seed=1)
    return root

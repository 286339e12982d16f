"""What a start checks before it deletes or loads anything, files rewritten atomically,
the model root a resume continues, strictly typed options with short errors, one-line ends for bad files.

In-process and fast; the one real subprocess here is a ``python -c`` that kills itself between a write and its
rename (the crash point of :mod:`sage_grpo.faults`). The whole-run cases are in tests/e2e/test_trust_runs.py.
"""

import errno
import re
import os
import signal
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from model_fixtures import tiny_args
from procs import run_group
from trust_support import alias_bomb
from trust_support import one_error_line as _one_error_line
from trust_support import snapshot as _snapshot

import sage_grpo.checkpoint as checkpoint_module
import sage_grpo.checkpoint.files as checkpoint_files
import sage_grpo.checkpoint.manager as checkpoint_manager
import sage_grpo.startup.build as startup_build
import sage_grpo.trainer as trainer_module
from sage_grpo.safe_io import writing as safe_writing
from sage_grpo.checkpoint import write_checkpoint_files
from sage_grpo.cli import generate as generate_cli
from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import MAX_ECHO_CHARS, from_dict, shorten
from sage_grpo.data import read_prompt_csvs
from sage_grpo.faults import FAULT_ENV
from sage_grpo.pipeline.generation import plan_generation
from sage_grpo.safe_io import DiskFullError, atomic_write
from sage_grpo.tracking.run_dir import truncate_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
# generate.py at the tiny model's size: were a check missing, the render would take a second, not hours
TINY_VIDEO = ["--fixed_size", "16x16", "--video_length", "5", "--num_inference_steps", "1", "--dtype", "fp32"]


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda *args: pytest.fail("models loaded although the input is invalid"))


@pytest.fixture
def earlier_run(tmp_path) -> Path:
    """A run directory as a finished run leaves it (the files --overwrite_output_dir deletes)."""
    run = tmp_path / "run"
    (run / "checkpoint-2" / "transformer").mkdir(parents=True)
    (run / "checkpoint-2" / "transformer" / "model.safetensors").write_bytes(b"weights")
    (run / "checkpoint-2" / "training_state.pt").write_bytes(b"state")
    (run / "tb").mkdir()
    (run / "tb" / "events").write_bytes(b"events")
    for name, text in (("run_config.yaml", "max_steps: 2\n"), ("metrics.jsonl", '{"step": 1}\n{"step": 2}\n'),
                       ("train.log", "step 1\nstep 2\n")):
        (run / name).write_text(text)
    return run


# ---------------------------------------------------------------- item 1: checked before anything is deleted

@pytest.mark.parametrize("extra,match", [
    (["--rollout_height", "20"], r"rollout size \(--rollout_height/--rollout_width\) 20x16: height and width "
                                 r"must be positive multiples of 8, got 20x16 \(the VAE of .*\). Fix: e.g. 16x16"),
    (["--sample_n_frames", "6"], r"--sample_n_frames 6: num_frames must be 1 \+ a multiple of 4"),
    (["--validation_interval", "1", "--validate_video_length", "7", "--validation_fixed_size", "16x16"],
     r"--validate_video_length 7: num_frames must be"),
    (["--validation_interval", "1", "--validation_fixed_size", "16x12"], r"validation size \(--validation_fixed_"
                                                                        r"size\) 16x12: height and width must"),
])
def test_sizes_are_refused_before_the_earlier_run_is_deleted(tiny_root, earlier_run, no_models, capsys, extra,
                                                             match):
    before = _snapshot(earlier_run)
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(tiny_root, earlier_run, "--overwrite_output_dir", "true", *extra))
    assert ended.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: ") and re.search(match, line), line
    assert _snapshot(earlier_run) == before


@pytest.mark.parametrize("flag", ["--flow_shift", "--guidance_scale"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_generate_refuses_non_finite_numbers_by_name(tiny_root, tmp_path, flag, value):
    config = parse_cli(GenerateConfig, ["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu",
                                        "--output_path", str(tmp_path / "v.mp4"), *TINY_VIDEO, f"{flag}={value}"])
    with pytest.raises(ValueError, match=rf"{flag} {value} is not a finite number"):
        plan_generation(config)


def test_every_float_option_of_both_commands_is_checked_for_finiteness(tiny_root, tmp_path):
    """Not a list someone keeps up to date: every float field of both configs, nan in turn."""
    from sage_grpo.config.sections import option_fields
    from sage_grpo.config.validation import check_finite_options

    for cls in (TrainConfig, GenerateConfig):
        floats = [f.name for _, f in option_fields(cls) if "float" in str(f.type)]
        assert len(floats) >= (20 if cls is TrainConfig else 2)
        for name in floats:
            with pytest.raises(ConfigError, match=rf"--{name} nan is not a finite number"):
                check_finite_options(from_dict(cls, {name: "nan"}))


def test_generate_ends_in_one_line_for_nan(tiny_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    status = generate_cli.main(["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu",
                                "--output_path", str(tmp_path / "v.mp4"), *TINY_VIDEO, "--flow_shift", "nan"])
    assert status == 2 and "--flow_shift nan" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize("content,line,match", [
    (b'prompt,seed\n"A cat walks,1\nA dog,2\n', 2, "never closes"),
    (b'prompt,seed\nA cat,1\nA dog,2\n"A bird" sings,3\n', 4, "',' expected after '\"'"),
])
def test_csv_quoting_errors_name_the_file_and_line(tmp_path, content, line, match):
    path = tmp_path / "prompts.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"prompts.csv', line {line}: .*{match}"):
        read_prompt_csvs([str(path)])


def test_csv_quoted_commas_and_newlines_still_read(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_bytes(b'prompt,seed\n"A cat, walking",1\n"two\nlines ""quoted""",2\n')
    assert [i.prompt for i in read_prompt_csvs([str(path)])] == ["A cat, walking", 'two\nlines "quoted"']


# ---------------------------------------------------------------- item 2: rewritten files are replaced atomically

def test_a_kill_between_write_and_rename_keeps_the_old_metrics(tmp_path):
    old = "".join(f'{{"step": {s}, "loss": {s}.5}}\n' for s in (1, 2, 3)) + '{"step": 4, "lo'
    (tmp_path / "metrics.jsonl").write_text(old)
    code = f"from sage_grpo.tracking.run_dir import truncate_metrics; truncate_metrics({str(tmp_path)!r}, 2)"
    env = dict(os.environ, **{FAULT_ENV: "rewrite:metrics.jsonl"})
    killed = run_group([sys.executable, "-W", "ignore", "-c", code], cwd=REPO_ROOT, env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / "metrics.jsonl").read_text() == old  # the history is whole, not 0 bytes

    with pytest.warns(RuntimeWarning, match="line 4"):
        truncate_metrics(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.5}\n{"step": 2, "loss": 2.5}\n'
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]
    assert leftovers == [f".metrics.jsonl.tmp-{pid}" for pid in [name.rsplit("-", 1)[1] for name in leftovers]]
    assert f".metrics.jsonl.tmp-{os.getpid()}" not in leftovers  # only the killed writer's temporary remains


def test_atomic_write_fsyncs_before_the_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    (tmp_path / "run_config.yaml").write_text("old\n")
    atomic_write(tmp_path / "run_config.yaml", "new\n")
    assert calls == ["fsync", "replace", "fsync"]  # the data, the rename, then the folder entry
    assert (tmp_path / "run_config.yaml").read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run_config.yaml"]  # no temporary left


def test_checkpoint_files_are_fsynced_before_the_directory_is_published(tmp_path, monkeypatch):
    """CheckpointManager.save: fsync_tree(tmp) comes before the rename into checkpoint-N."""
    synced = []
    monkeypatch.setattr(checkpoint_manager, "fsync_tree", lambda root: synced.append(sorted(
        str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())))
    from types import SimpleNamespace

    from sage_grpo.rl.anchor import MovingAnchorSchedule

    class Models:
        policy = torch.nn.Linear(2, 2)

        def trainable_state_dict(self):
            return dict(self.policy.state_dict())

        def save_extras(self, directory):
            pass

    optimizer = torch.optim.SGD(Models.policy.parameters(), lr=0.1)
    counters = SimpleNamespace(state_dict=lambda: {"global_step": 1, "update_steps": 1, "micro_steps": 1})
    dims = SimpleNamespace(is_main=True, device=torch.device("cpu"), is_distributed=False)
    manager = checkpoint_module.CheckpointManager(
        models=Models(), optimizer=optimizer, kl_controller=None, anchor_schedule=MovingAnchorSchedule(False, 1),
        counters=counters, dims=dims, run_dir=tmp_path, keep_checkpoints=0, layout={}, config_yaml=lambda: "a: 1\n",
        log=print)
    final = manager.save(1)
    assert synced and "training_state.pt" in synced[0] and "transformer/model.safetensors" in synced[0]
    assert final == tmp_path / "checkpoint-1" and (final / "config.yaml").read_text() == "a: 1\n"


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_names_the_file_and_the_space_it_needed(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(DiskFullError, match=r"disk full while writing .*metrics.jsonl: it needs about 0.0 MiB and "
                                            r"[0-9.]+ MiB is free there"):
        atomic_write(tmp_path / "metrics.jsonl", "x" * 100)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]

    monkeypatch.setattr(checkpoint_files, "save_file", _enospc)
    weights = {"w": torch.zeros(1024, 1024)}  # 4 MiB (+ 1 MiB for the small files)
    with pytest.raises(DiskFullError, match=r"checkpoint-1/transformer/model.safetensors: it needs about 5.0 MiB"):
        write_checkpoint_files(tmp_path / "checkpoint-1", model_state=weights, training_state={"global_step": 1})


Usage = namedtuple("Usage", "free")


def test_torch_save_on_a_full_disk_is_named_too(tmp_path, monkeypatch):
    """torch.save's C++ writer reports a full disk as "basic_ios::clear: iostream error", without an errno."""
    def failing_save(obj, path):
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(checkpoint_files.torch, "save", failing_save)
    monkeypatch.setattr(safe_writing.shutil, "disk_usage", lambda path: Usage(free=1024))
    with pytest.raises(DiskFullError, match=r"optimizer.pt: it needs about"):
        write_checkpoint_files(tmp_path / "c", model_state={"w": torch.zeros(2)}, training_state={},
                               optimizer_state={"state": {0: {"m": torch.zeros(4096)}}})
    monkeypatch.setattr(safe_writing.shutil, "disk_usage", lambda path: Usage(free=1 << 40))
    with pytest.raises(RuntimeError, match="iostream"):  # with space left it is some other failure: unchanged
        write_checkpoint_files(tmp_path / "d", model_state={"w": torch.zeros(2)}, training_state={})


def test_disk_full_ends_a_run_in_one_line(tiny_root, tmp_path, monkeypatch, capsys):
    def run_training(cfg, start=None):
        write_checkpoint_files(Path(cfg.output.output_dir) / ".checkpoint-1.tmp", model_state={"w": torch.zeros(2)},
                               training_state={})

    monkeypatch.setattr(checkpoint_files, "save_file", _enospc)
    monkeypatch.setattr(trainer_module, "run_training", run_training)
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(tiny_root, tmp_path / "run"))
    assert ended.value.code == 2
    assert _one_error_line(capsys.readouterr().err).startswith("error: [Errno 28] disk full while writing")


# ---------------------------------------------------------------- item 6: strict types, bounded messages

@pytest.mark.parametrize("values,match", [
    ({"neg_prompt": ["a", "b"]}, "neg_prompt: expected one value .* got a list"),
    ({"reward_kwargs": {"target_rgb": [0, 0, 1]}}, "reward_kwargs: expected one value .* got a dict: .*quoted string"),
    ({"max_steps": [3]}, "max_steps: expected one value"),
    ({"use_lora": {"a": 1}}, "use_lora: expected one value"),
    ({"train_video_csv": [["a.csv"]]}, r"train_video_csv: expected a list of values .* got a list: \['a.csv'\]"),
])
def test_options_are_typed_strictly(values, match):
    with pytest.raises(ValueError, match=match):
        from_dict(TrainConfig, values)


def test_a_yaml_alias_bomb_gives_a_short_error_fast(tmp_path, capsys):
    bomb = alias_bomb(tmp_path / "bomb.yaml", 7)  # 4.8 million strings if anything expanded it
    start = time.perf_counter()
    with pytest.raises(SystemExit) as ended:
        parse_cli(TrainConfig, ["--config", str(bomb)])
    elapsed = time.perf_counter() - start
    line = _one_error_line(capsys.readouterr().err)
    assert ended.value.code == 2 and "reward_kwargs: expected one value" in line
    assert len(line) < 2 * MAX_ECHO_CHARS + 300, len(line)
    assert elapsed < 5.0, elapsed  # measured 0.3 s for the whole process on the 2-core machine


def test_long_values_are_cut_in_error_messages(capsys):
    with pytest.raises(SystemExit):
        parse_cli(TrainConfig, ["--max_steps", "9" * 10 + "x" * 5000])
    line = _one_error_line(capsys.readouterr().err)
    assert "... (5010 chars)" in line and len(line) < 2 * MAX_ECHO_CHARS + 300, line
    with pytest.raises(ValueError, match=r"reward_kwargs is not valid JSON .*\.\.\. \(100002 chars\)"):
        from sage_grpo.config.reward_weights import json_dict

        json_dict("{" + "x" * 100000 + "}", "reward_kwargs", "{}")
    assert len(shorten([[["deep"] * 1000] * 1000] * 1000)) <= MAX_ECHO_CHARS + 3


# ---------------------------------------------------------------- item 8: one-line ends

def test_a_yaml_python_tag_in_config_is_one_line(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    config = tmp_path / "evil.yaml"
    config.write_text(f'max_steps: 2\nx: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SystemExit) as ended:
        parse_cli(TrainConfig, ["--config", str(config)])
    line = _one_error_line(capsys.readouterr().err)
    assert ended.value.code == 2 and f"--config {config}, line 2: not plain YAML data" in line
    assert "python/object/apply:os.system" in line and not marker.exists()


def test_flash_attention_on_the_cpu_is_refused_before_models_load(tiny_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    status = generate_cli.main(["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu",
                                "--output_path", str(tmp_path / "v.mp4"), *TINY_VIDEO, "--attention_backend", "flash"])
    line = _one_error_line(capsys.readouterr().err)
    assert status == 2 and re.search("--attention_backend: attention backend 'flash' (runs on CUDA only|is not "
                                     "usable here)", line), line


def test_cuda_only_backends_are_refused_on_the_cpu_even_when_installed():
    from sage_grpo.models.attention import check_attention_backend

    check_attention_backend("_native_flash")  # torch's own: installed everywhere
    with pytest.raises(ValueError, match="'_native_flash' runs on CUDA only, and the device is cpu; use 'native'"):
        check_attention_backend("_native_flash", torch.device("cpu"))
    check_attention_backend("native", torch.device("cpu"))


class RunsCode:
    """Pickles into a call of ``os.system`` (what a crafted file does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_in_place_of_a_distcp_shard_is_one_named_error(tmp_path, capsys):
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    from sage_grpo.export.weights import read_dcp_state_dict
    from sage_grpo.safe_io import CheckpointError

    folder, marker = tmp_path / "transformer_dcp", tmp_path / "code_ran"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in this process alone"
        dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=str(folder))
    shard = next(folder.glob("*.distcp"))
    shard.write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(CheckpointError, match=rf"cannot read the DCP checkpoint {folder}: a shard is not tensor data"
                                              r" written by torch.distributed.checkpoint \(Unsupported .*\)\. Was a "
                                              r".distcp file") as info:
        read_dcp_state_dict(folder)  # generate.py --checkpoint_path, export and a sharded resume read shards so
    assert not marker.exists() and "weights_only" not in str(info.value)


@pytest.fixture
def video_reward_root(tmp_path):
    from sage_grpo.rewards.tiny import write_tiny_video_reward

    write_tiny_video_reward(tmp_path / "reward_root", seed=0)
    return tmp_path / "reward_root"


def test_a_bad_video_reward_checkpoint_is_one_named_error(video_reward_root, tmp_path, monkeypatch, capsys):
    from sage_grpo.rewards.tiny import FULL_STEP, LORA_STEP
    from sage_grpo.rewards.videoalign import VideoAlignReward
    from sage_grpo.safe_io import CheckpointError, UnsafeFileError

    def build(step):
        return VideoAlignReward(video_reward_root, device="cpu", dtype=torch.float32, checkpoint_step=step)

    marker = tmp_path / "code_ran"
    full = video_reward_root / "VideoReward" / f"checkpoint-{FULL_STEP}" / "model.pth"
    torch.save({"payload": RunsCode(marker)}, full)
    with pytest.raises(UnsafeFileError, match=rf"refusing to load VideoReward weights {full}") as info:
        build(FULL_STEP)
    assert "weights_only=False" not in str(info.value) and not marker.exists()
    full.write_bytes(b"\x80\x02truncated")
    with pytest.raises(CheckpointError, match=rf"cannot read VideoReward weights {full}"):
        build(FULL_STEP)
    adapter = video_reward_root / "VideoReward" / f"checkpoint-{LORA_STEP}" / "adapter_model.safetensors"
    adapter.write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=rf"cannot read VideoReward adapter {adapter}"):
        build(LORA_STEP)

    # the training command ends in one line (the reward is built at start, after the models)
    monkeypatch.setattr("sage_grpo.startup.resolve", lambda cfg, set_threads=False: None)  # no model root here
    monkeypatch.setattr(trainer_module, "run_training", lambda cfg, start=None: build(FULL_STEP))
    with pytest.raises(SystemExit) as ended:
        train_cli.main(["--device", "cpu", "--sp_size", "1", "--batch_size", "2", "--num_generations", "2",
                        "--output_dir", str(tmp_path / "run")])
    assert ended.value.code == 2
    err = capsys.readouterr().err  # transformers' loading progress bar comes first
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"error: cannot read VideoReward "
                                                                              f"weights {full}")


def test_a_lora_folder_without_safetensors_is_one_line(tiny_root, tmp_path, capsys):
    folder = tmp_path / "lora"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "peft_type": "LORA"}')
    (folder / "adapter_model.bin").write_bytes(b"old peft pickle format")
    status = generate_cli.main(["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu",
                                "--output_path", str(tmp_path / "v.mp4"), *TINY_VIDEO, "--lora_path", str(folder)])
    line = _one_error_line(capsys.readouterr().err)
    assert status == 2 and f"--lora_path: {folder} is a LoRA adapter folder without adapter_model.safetensors" in line
    assert "adapter_model.bin" in line
    with pytest.raises(FileNotFoundError, match="--pretrained_lora_path .* adapter_model.safetensors"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--use_lora", "true",
                                                                    "--pretrained_lora_path", str(folder))))


# ---------------------------------------------------------------- item 3: the model root a resume continues

@pytest.fixture(scope="module")
def other_root(tmp_path_factory) -> Path:
    """A second tiny model root: the same shapes and configs as tiny_root, other weights (seed 1)."""
    from sage_grpo.models import write_tiny_hunyuan

    root = tmp_path_factory.mktemp("other_tiny_root")
    write_tiny_hunyuan(root, seed=1)
    return root


def _checkpoint_of(tiny_root, tmp_path) -> Path:
    """A checkpoint as the trainer writes it (stand-in tensors) of a run on ``tiny_root``."""
    import yaml

    from sage_grpo.config import to_dict
    from sage_grpo.resume import layout_record

    from sage_grpo.export.identity import transformer_shapes

    cfg = parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run"))
    layout = layout_record(cfg.model, 1, 1, 1, cfg.data.batch_size)  # one process: batch_size videos a step
    state = {"global_step": 2, "update_steps": 2, "micro_steps": 2, "kl_controller": None,
             "anchor_schedule": {"last_refreshed_at": None}, "layout": layout}
    path = tmp_path / "run" / "checkpoint-2"
    weights = {name: torch.zeros(shape) for name, shape in  # a full fine-tune's: every parameter, in its shape
               transformer_shapes(tiny_root, cfg.model.pretrained_transformer_version, parameters_only=True).items()}
    write_checkpoint_files(path, model_state=weights, optimizer_state={"state": {}},
                           training_state=state, config_yaml=yaml.safe_dump(to_dict(cfg)))
    (tmp_path / "run" / "run_config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    return path


def test_resuming_on_other_weights_is_refused_unless_allowed(tiny_root, other_root, tmp_path, no_models):
    import shutil
    from types import SimpleNamespace

    import yaml

    from sage_grpo.resume import CONFIG_CHANGES_FILE
    from sage_grpo.startup import resolve
    from sage_grpo.startup.run_files import take_run_dir

    path = _checkpoint_of(tiny_root, tmp_path)
    resume = ["--resume_from_checkpoint", str(path)]
    other = tiny_args(tiny_root, tmp_path / "run", *resume, "--pretrained_model_root", str(other_root))
    with pytest.raises(ConfigError, match=r"model root --pretrained_model_root \(differs in text_encoder, "
                                          r"text_encoder_2, transformer/480p_t2v, vae\) '.*tiny_ckpt' -> "):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, other))

    copy = tmp_path / "moved_root"  # the same weights elsewhere: the same run
    shutil.copytree(tiny_root, copy)
    with pytest.raises(pytest.fail.Exception, match="models loaded"):
        trainer_module.GRPOTrainer(parse_cli(TrainConfig, tiny_args(copy, tmp_path / "run", *resume)))

    cfg = parse_cli(TrainConfig, other + ["--allow_config_change", "true"])
    with pytest.raises(pytest.fail.Exception, match="models loaded"):  # allowed: the preflight passes
        trainer_module.GRPOTrainer(cfg)
    start, notes = resolve(cfg), []
    run_dir = take_run_dir(start.cfg, start.plan, start.run_claim, notes)
    assert yaml.safe_load((run_dir / "run_config.yaml").read_text())["pretrained_model_root"] == str(other_root)
    (recorded,) = yaml.safe_load((run_dir / CONFIG_CHANGES_FILE).read_text())
    (key,) = recorded["changes"]
    assert key.startswith("model root") and recorded["changes"][key] == {"checkpoint": str(tiny_root),
                                                                         "now": str(other_root)}
    assert any("--allow_config_change" in note and "model root" in note for note in notes)  # the log


def test_the_fingerprint_reads_no_weight_file_whole(tiny_root, monkeypatch):
    from sage_grpo.resume import model_fingerprint

    read = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or real(self))
    digests = model_fingerprint(tiny_root, "480p_t2v")
    assert {"transformer/480p_t2v", "vae", "text_encoder", "scheduler"} <= set(digests)
    assert read and not any(name.endswith(".safetensors") for name in read)

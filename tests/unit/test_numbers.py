"""Every number a user gives is checked before anything loads, in one line naming it and a valid alternative: the
options of post_train.py, generate.py and the evaluation (each declares its bound, sage_grpo/config/bounds.py), the reward
weights, the group size and the accumulation against the run's length. In-process calls of the commands' mains."""

import re
from pathlib import Path

import pytest
from launch_flags import RUN_POST_TRAIN_FLAGS
from model_fixtures import tiny_args

import sage_grpo.startup.build as startup_build
from sage_grpo.cli import generate as generate_cli
from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.bounds import Bound
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import from_dict, load_yaml
from sage_grpo.config.sections import option_fields
from sage_grpo.config.validation import check_bounds, check_option_values, validate_train_config
from sage_grpo.evaluate import main as evaluate_main
from sage_grpo.evaluate.config import EvaluateConfig

CONFIGS = (TrainConfig, GenerateConfig, EvaluateConfig)


def declared_bounds(cls) -> dict:
    """Option name -> the bound its field declares (a Bound, a reason, or None when it declares none)."""
    return {field.name: field.metadata.get("bound") for _, field in option_fields(cls)}
TINY_VIDEO = ["--fixed_size", "16x16", "--video_length", "5", "--num_inference_steps", "1", "--dtype", "fp32"]


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models",
                        lambda *args: pytest.fail("models loaded although the input is invalid"))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if not line.startswith(("CPU threads", "warning"))]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def refused_by_train(tiny_root, tmp_path, capsys, *extra) -> str:
    with pytest.raises(SystemExit) as ended:
        train_cli.main(tiny_args(tiny_root, tmp_path / "run", *extra))
    assert ended.value.code == 2
    line = one_error_line(capsys)
    assert line.startswith("error: ")
    assert not (tmp_path / "run").exists()  # nothing written
    return line


# ---------------------------------------------------------------- the reward weights

@pytest.mark.parametrize("weights,match", [
    ('{"target_color": NaN}', r"reward_weights\['target_color'\] must be a finite number, got nan"),
    ('{"target_color": Infinity}', r"reward_weights\['target_color'\] must be a finite number, got inf"),
    ('{"target_color": -Infinity}', r"reward_weights\['target_color'\] must be a finite number, got -inf"),
    ('{"target_color": 0}', r"every weight is 0, so the reward is 0 for every video"),
])
def test_reward_weights_must_be_finite_and_not_all_zero(tiny_root, tmp_path, capsys, no_models, weights, match):
    """A NaN weight made every reward NaN: the run stopped three steps later blaming the reward (exit 0 with fewer
    steps, nothing learnt)."""
    line = refused_by_train(tiny_root, tmp_path, capsys, "--reward_weights", weights)
    assert re.search(match, line), line


def test_extra_reward_weights_must_be_finite_and_not_all_zero():
    from sage_grpo.rewards import plan_reward_models

    with pytest.raises(ValueError, match=r"clipscore\['weight'\] must be a finite number, got nan"):
        plan_reward_models("target_color", {"target_color": 1.0}, extra_models={"clipscore": float("nan")})
    with pytest.raises(ValueError, match=r"every reward model's weight is 0 \(target_color, brightness\)"):
        plan_reward_models("target_color", {"target_color": 1.0}, extra_models={"target_color": 0, "brightness": 0})


# ---------------------------------------------------------------- groups and updates

def test_a_group_of_one_is_refused(tiny_root, tmp_path, capsys, no_models):
    line = refused_by_train(tiny_root, tmp_path, capsys, "--num_generations", "1", "--batch_size", "1")
    assert "[group-size] --num_generations 1 must be >= 2: GRPO needs groups of at least 2 videos" in line
    assert "Fix: use --num_generations 4" in line


@pytest.mark.parametrize("extra,match", [
    (["--max_steps", "2", "--gradient_accumulation_steps", "3"],
     r"--gradient_accumulation_steps 3 with --max_steps 2 makes no optimizer update: one is made every 3 rollout "
     r"batches and the run trains 2\. Fix: use --gradient_accumulation_steps 2 \(or less\), or --max_steps 3"),
    (["--max_steps", "1", "--num_inner_epochs", "2", "--gradient_accumulation_steps", "5"],
     r"--max_steps 1 x --num_inner_epochs 2 makes no .* the run trains 2\. Fix: use --gradient_accumulation_steps 2 "
     r"\(or less\), or --max_steps 3 \(or more\)"),
])
def test_an_accumulation_longer_than_the_run_is_refused(tiny_root, tmp_path, capsys, no_models, extra, match):
    line = refused_by_train(tiny_root, tmp_path, capsys, *extra)
    assert "[no-optimizer-update]" in line and re.search(match, line), line


def test_the_accumulation_counts_rollout_batches_not_samples():
    """One rollout batch (any --batch_size) is one accumulation unit: max_steps x num_inner_epochs of them."""
    check_option_values(TrainConfig.of(max_steps=3, gradient_accumulation_steps=3, batch_size=8, num_generations=4))
    check_option_values(TrainConfig.of(max_steps=2, num_inner_epochs=2, gradient_accumulation_steps=4))
    with pytest.raises(ConfigError, match="no-optimizer-update"):  # any schedule, constant included
        check_option_values(TrainConfig.of(max_steps=3, gradient_accumulation_steps=4, lr_scheduler="constant"))


# ---------------------------------------------------------------- every numeric option has a bound or a reason

def _numeric(cls) -> list:
    return [f.name for _, f in option_fields(cls) if re.search(r"\b(int|float)\b", str(f.type))]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda x: x.__name__)
def test_every_numeric_option_declares_its_bound(cls):
    numeric, declared = _numeric(cls), declared_bounds(cls)
    assert len(numeric) >= {TrainConfig: 70, GenerateConfig: 10, EvaluateConfig: 9}[cls]
    for name in numeric:  # a new number declares its bound with its field, or the reason it has none
        entry = declared[name]
        assert isinstance(entry, Bound) or (isinstance(entry, str) and len(entry) > 10), name
    assert [name for name, entry in declared.items() if entry is not None and name not in numeric] == []


def _outside(bound: Bound, is_int: bool) -> list:
    """Values just outside ``bound`` (below its low end, above its high end)."""
    step = 1 if is_int else 0.5
    values = []
    if bound.low is not None:
        values.append(bound.low if bound.low_open else bound.low - step)
    if bound.high is not None:
        values.append(bound.high if bound.high_open else bound.high + step)
    return [int(v) if is_int else float(v) for v in values]


def _cases():
    for cls in CONFIGS:
        fields = {f.name: f for _, f in option_fields(cls)}
        for name, bound in declared_bounds(cls).items():
            if isinstance(bound, Bound):
                for value in _outside(bound, "int" in str(fields[name].type)):
                    yield pytest.param(cls, name, value, id=f"{cls.__name__}.{name}={value}")


@pytest.mark.parametrize("cls,name,value", list(_cases()))
def test_a_value_outside_its_bound_is_one_line_naming_it(cls, name, value):
    """Through the options' parser (a flag and a YAML key alike), then the check every command runs first."""
    bound = declared_bounds(cls)[name]
    config = from_dict(cls, {name: str(value)})
    check = (lambda c: check_option_values(c)) if cls is TrainConfig else check_bounds
    with pytest.raises(ConfigError) as refused:
        check(config)
    message = str(refused.value)
    assert "\n" not in message and f"[{bound.rule_for(name)}] --{name} {value} must be {bound.text()}" in message
    assert "Fix: " in message


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda x: x.__name__)
def test_the_defaults_are_inside_every_bound(cls):
    check_bounds(cls())


def test_the_reference_launch_and_the_shipped_configs_pass():
    """The reference's run_post_train.sh flags on its 8 GPUs, and every YAML file of configs/."""
    validate_train_config(parse_cli(TrainConfig, RUN_POST_TRAIN_FLAGS), world_size=8, num_attention_heads=16)
    configs = sorted((Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml"))
    assert len(configs) >= 20
    for path in configs:
        check_option_values(from_dict(TrainConfig, load_yaml(str(path)), source=str(path)))


@pytest.mark.parametrize("extra,match", [
    (["--video_fps", "0"], r"\[video_fps-positive\] --video_fps 0 must be >= 1"),
    (["--lora_r", "0"], r"\[lora_r-positive\] --lora_r 0 must be >= 1"),
    (["--infer_flow_shift_video", "-5"], r"\[infer_flow_shift_video-positive\] --infer_flow_shift_video -5.0 must "
                                         r"be > 0. Fix: use 5.0 \(the default\)"),
    (["--debug_train_diagnostics_interval", "0"], r"--debug_train_diagnostics_interval 0 must be >= 1"),
    (["--gpu_memory_gb", "0"], r"--gpu_memory_gb 0.0 must be > 0. Fix: leave it unset for its default"),
    (["--drift_guard_reward_rise", "-1"], r"--drift_guard_reward_rise -1.0 must be >= 0"),
])
def test_train_refuses_the_numbers_nothing_checked(tiny_root, tmp_path, capsys, no_models, extra, match):
    """Accepted before: --video_fps 0 divided by zero in VideoAlign's frame sampling, --lora_r 0 failed in peft
    after the models loaded, --infer_flow_shift_video -5 sampled a broken sigma schedule."""
    line = refused_by_train(tiny_root, tmp_path, capsys, *extra)
    assert re.search(match, line), line


@pytest.mark.parametrize("extra,match", [
    (["--guidance_scale", "-1"], r"\[guidance_scale-positive\] --guidance_scale -1.0 must be > 0"),
    (["--cache_step_interval", "0"], r"\[cache_step_interval-positive\] --cache_step_interval 0 must be >= 1"),
    (["--num_inference_steps", "0"], r"\[num_inference_steps-positive\] --num_inference_steps 0 must be >= 1"),
])
def test_generate_refuses_numbers_out_of_range(tiny_root, tmp_path, capsys, monkeypatch, extra, match):
    monkeypatch.setattr(generate_cli, "run_generation", lambda config: pytest.fail("generation started"))
    argv = ["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu",
            "--output_path", str(tmp_path / "v.mp4"), *TINY_VIDEO, *extra]
    assert generate_cli.main(argv) == 2
    line = one_error_line(capsys)
    assert re.search(match, line), line


def test_the_evaluation_refuses_numbers_out_of_range(tmp_path, capsys):
    prompts = tmp_path / "eval.csv"
    prompts.write_text("prompt\nA cat walks\n")
    common = ["--checkpoints", "base", "--prompts", str(prompts), "--model_path", str(tmp_path), "--metrics",
              "target_color"]
    assert evaluate_main([*common, "--picture_frames", "0"]) == 2
    assert "[picture_frames-positive] --picture_frames 0 must be >= 1" in one_error_line(capsys)
    assert evaluate_main([*common, "--guidance_scale", "nan"]) == 2
    assert "--guidance_scale nan is not a finite number" in one_error_line(capsys)


@pytest.mark.parametrize("flag", ["--world_size", "--simulate_layers"])
def test_the_memory_plan_refuses_a_count_below_one(capsys, flag):
    from sage_grpo.plan.report import main as plan_main

    with pytest.raises(SystemExit) as ended:
        plan_main([flag, "0", "--sp_size", "1", "--batch_size", "4", "--num_generations", "4"])
    assert ended.value.code == 2
    assert one_error_line(capsys) == f"error: {flag} 0 must be >= 1 (GPUs of the launch, or transformer blocks)"

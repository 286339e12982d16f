"""One start-up resolution (sage_grpo/startup/): the flags, the model folder and the machine become one frozen RunPlan
before any model loads; it is printed once at the start, recorded in the run directory as run_plan.json, and the
command line is parse -> resolve -> train."""

import dataclasses
import json

import pytest
from model_fixtures import tiny_args

import sage_grpo.startup.build as startup_build
import sage_grpo.trainer as trainer_module
from sage_grpo.cli import train as train_cli
from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.startup import RunPlan, Startup, resolve
from sage_grpo.startup.run_files import take_run_dir
from sage_grpo.tracking.run_dir import RUN_PLAN_FILE, overwrite_targets

pytestmark = pytest.mark.unit


@pytest.fixture
def no_models(monkeypatch):
    monkeypatch.setattr(startup_build, "build_models", lambda *args: pytest.fail("models loaded"))


def test_every_decision_is_made_before_any_model_loads_and_nothing_is_written(tiny_root, tmp_path, no_models):
    run = tmp_path / "run"
    start = resolve(parse_cli(TrainConfig, tiny_args(tiny_root, run, "--sde_window_size", "2", "--max_steps", "4",
                                                     "--gradient_accumulation_steps", "2", "--num_inner_epochs", "3",
                                                     "--validation_interval", "5", "--validation_fixed_size", "32x48",
                                                     "--validate_video_length", "9")))
    plan = start.plan
    assert isinstance(plan, RunPlan) and dataclasses.is_dataclass(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.notes = ()
    assert str(plan.device) == "cpu" and plan.memory is None  # no GPU budget on the CPU
    layout = plan.layout
    assert (layout.world_size, layout.dp_size, layout.sp_size, layout.ranks_per_group, layout.groups_per_rank,
            layout.fsdp, layout.videos_per_step) == (1, 1, 1, 1, 1, False, 2)
    assert (plan.sampling.cfg_scale, plan.sampling.validation_shift) == (6.0, 5.0)  # the 480p_t2v variant's
    assert (plan.kl_mode.name, plan.kl_mode.uses_reference) == ("dual_moving", True)  # the defaults, KL on
    schedule = plan.schedule
    assert (schedule.rollout.frames, schedule.rollout.height, schedule.rollout.width) == (5, 16, 16)
    assert (schedule.validation.frames, schedule.validation.height, schedule.validation.width) == (9, 32, 48)
    assert schedule.validates and (schedule.window.size, schedule.window.num_steps) == (2, 3)
    assert schedule.trained_steps_per_sample == 2 and schedule.total_updates == 4 * 3 // 2
    assert (plan.attention.backend, plan.attention.split_rows) == ("native", False)  # masked on the CPU
    assert plan.resume.check is None and not plan.resume.restart and not plan.resume.resuming
    assert plan.cpu_threads.startswith("CPU threads: ") and "as the caller set them" in plan.cpu_threads
    assert plan.subject.reward == 'local target_color, weights {"target_color": 1.0}'
    assert [item.prompt for item in start.items] and start.validation_sampler is not None
    assert not run.exists()  # resolved, checked, nothing written


def test_the_plan_is_recorded_as_json_with_the_run_config(tiny_root, tmp_path, no_models):
    run = tmp_path / "run"
    start = resolve(parse_cli(TrainConfig, tiny_args(tiny_root, run)))
    record = start.plan.as_record()
    assert json.loads(json.dumps(record)) == record  # JSON data all through
    assert set(record) == {"device", "layout", "sampling", "kl_mode", "drift_watch", "reward", "placement",
                           "attention", "schedule", "resume", "cpu_threads", "memory", "subject", "notes"}
    assert record["resume"] == {"restart": False, "checkpoint": None, "sharded": None, "at_step": None,
                                "differences": {}}
    assert record["schedule"]["rollout"] == {"height": 16, "width": 16, "frames": 5}
    assert record["reward"]["aggregation"]["mode"] == "sum" and "target_color" in record["reward"]["models"]
    notes = []
    run_dir = take_run_dir(start.cfg, start.plan, start.run_claim, notes)
    assert json.loads((run_dir / RUN_PLAN_FILE).read_text()) == record
    assert (run_dir / "run_config.yaml").is_file()
    assert run_dir / RUN_PLAN_FILE in overwrite_targets(run_dir)  # --overwrite_output_dir clears it with the run


def test_the_plan_is_printed_once_with_the_summary_and_every_decision(tiny_root, tmp_path, no_models):
    run = tmp_path / "run"
    lines = resolve(parse_cli(TrainConfig, tiny_args(tiny_root, run, "--max_steps", "6"))).plan.lines(run)
    assert lines[:2] == ["run summary:", f"  run directory  {run}"]
    assert lines[4] == "  world          1 process(es) = dp 1 x sp 1 on cpu"
    heads = [line[2:15].strip() for line in lines[7:]]
    assert heads == ["sampling", "videos", "KL", "drift watch", "placement", "attention", "parallel", "resume",
                     "CPU threads:"]
    assert lines[8] == ("  videos         rollout 5x16x16, no validation; 3 trained step(s) per sample, SDE window "
                        "off, 6 optimizer updates")
    assert lines[14] == "  resume         a new run"


def test_the_command_line_resolves_then_trains(tiny_root, tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(trainer_module, "run_training", lambda cfg, start=None: started.append(start))
    assert train_cli.main(tiny_args(tiny_root, tmp_path / "run", "--cpu_threads", "1")) == 0
    (start,) = started
    assert isinstance(start, Startup) and start.plan.cpu_threads == "CPU threads: 1, from --cpu_threads"
    assert capsys.readouterr().out.splitlines()[0] == "CPU threads: 1, from --cpu_threads"  # printed before the rest

"""docs/faq.md quotes the lines users meet most; each is produced here, the way a run produces it, and matched against
the page (``…`` stands for the parts that depend on the run): a message that changes fails here until the page says
what the project now prints."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from doc_commands_support import read_blocks
from model_fixtures import tiny_args
from procs import start_group
from reward_options_support import ServerThread, fast_remote
from trust_support import write_checkpoint_two

from sage_grpo.cli import train as train_cli
from sage_grpo.config import ConfigError
from sage_grpo.config.train import TrainConfig
from sage_grpo.pipeline.drift import DriftSentinel
from sage_grpo.pipeline.failed_steps import count_failed_step, step_failures
from sage_grpo.plan import report as plan_report
from sage_grpo.rewards.remote import RemoteReward, RemoteRewardError
from sage_grpo.rewards.serving import RewardService, ServerLimits
from sage_grpo.rewards.setup import RewardFailure
from sage_grpo.rewards.toys import ToySuiteReward
from sage_grpo.rl import NO_KL
from sage_grpo.rl.drift_guard import drift_watch_of
from sage_grpo.startup.threads import apply_cpu_thread_policy
from sage_grpo.tracking.run_lock import LOCK_FILE, acquire_run_lock, check_lock_free, release_run_locks, this_process

FAQ = Path(__file__).resolve().parents[2] / "docs" / "faq.md"
MESSAGES = {block.detail: block.text.strip() for block in read_blocks(FAQ)[0] if block.mode == "message"}


def matches(template: str, line: str) -> bool:
    pattern = ".+?".join(re.escape(part) for part in template.split("…"))
    return re.fullmatch(pattern, line) is not None


def memory_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = TrainConfig.of(sp_size=2, validation_interval=0, gpu_memory_gb=24.0, device="cuda")
    with pytest.raises(ConfigError) as refused:
        plan_report.check_memory_plan(cfg)
    return f"error: {refused.value}".splitlines()[0]  # the plan's table follows on the next lines


def resume_refused(tmp_path, monkeypatch, capsys, tiny_root):
    args = tiny_args(tiny_root, tmp_path / "run", "--sde_type", "sage_grpo")
    path = write_checkpoint_two(args, {"w": torch.ones(2)})
    with pytest.raises(SystemExit):
        train_cli.main(args + ["--sde_type", "flow_grpo", "--resume_from_checkpoint", str(path)])
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")][0]


def run_folder_held(tmp_path, monkeypatch, capsys):
    lock = {**this_process(), "host": "other-node", "pid": 4242, "started": "2026-12-06 10:00:00 +0000"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(lock))
    with pytest.raises(ConfigError) as refused:
        check_lock_free(tmp_path)
    return f"error: {refused.value}"


def nan_stop(tmp_path, monkeypatch, capsys):
    causes = step_failures({"failed_reward_count": 0, "total_loss": float("nan"), "skipped_updates": 1}, 4)
    with pytest.raises(RewardFailure) as stopped:
        streak = count_failed_step(0, 3, causes, 3, lambda line: None)
        streak = count_failed_step(streak, 4, causes, 3, lambda line: None)
        count_failed_step(streak, 5, causes, 3, lambda line: None)
    return f"error: {stopped.value}"


def reward_server_401(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SAGE_GRPO_REWARD_TOKEN", raising=False)
    server = ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0, auth_token="s" * 20))
    try:
        with pytest.raises(RemoteRewardError) as refused:
            RemoteReward("toy_suite", fast_remote(server.url), video_fps=24.0)
    finally:
        server.stop()
    return str(refused.value)


def reward_server_413(tmp_path, monkeypatch, capsys):
    server = ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0,
                                       limits=ServerLimits(max_frames=4)))
    try:
        remote = RemoteReward("toy_suite", fast_remote(server.url), video_fps=24.0)
        with pytest.warns(RuntimeWarning) as warned:  # the request's videos score NaN; the step trains on the rest
            scores = remote(torch.rand(1, 3, 5, 8, 8), ["a red disk"])
    finally:
        server.stop()
    assert all(torch.isnan(value).all() for value in scores.values())
    return str(warned[0].message)


def requeue(tmp_path, monkeypatch, capsys):
    gone = start_group([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    (tmp_path / LOCK_FILE).write_text(json.dumps({**this_process(), "pid": gone.pid,
                                                  "started": "2026-12-06 10:00:00 +0000"}))
    notes = []
    acquire_run_lock(tmp_path, notes.append)
    release_run_locks()
    return f"note: {notes[0]}"


def drift_alarm(tmp_path, monkeypatch, capsys):
    cfg = TrainConfig.of(drift_guard="warn")
    lines = []
    validator = type("Validator", (), {"add_metric": lambda self, metric: None})()
    sentinel = DriftSentinel(drift_watch_of(cfg.drift, 1, False, NO_KL), validator, lines.append)
    sentinel.observe(0, {"Validation/drift_proxy": 0.1})
    sentinel.record_step({"gathered_avg_reward_mean": 0.5})
    sentinel.observe(2, {"Validation/drift_proxy": 0.9})  # 9x the baseline: past the alarm bound (8)
    return next(line for line in lines if line.startswith("DRIFT GUARD (warn)"))


def cpu_threads(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        return apply_cpu_thread_policy(TrainConfig.of().parallel, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)


PRODUCERS = {"memory-plan": memory_plan, "resume-refused": resume_refused, "run-folder-held": run_folder_held,
             "nan-stop": nan_stop, "reward-server-401": reward_server_401, "reward-server-413": reward_server_413,
             "requeue": requeue, "cpu-threads": cpu_threads, "drift-alarm": drift_alarm}


def test_every_message_on_the_page_has_its_producer():
    assert sorted(MESSAGES) == sorted(PRODUCERS)


@pytest.mark.parametrize("name", sorted(PRODUCERS))
def test_the_page_quotes_what_the_project_prints(name, tmp_path, monkeypatch, capsys, request):
    producer = PRODUCERS[name]
    extra = {"tiny_root": request.getfixturevalue("tiny_root")} if name == "resume-refused" else {}
    line = producer(tmp_path, monkeypatch, capsys, **extra)
    assert "\n" not in line and matches(MESSAGES[name], line), line


def test_the_matcher():
    assert matches("error: a … b", "error: a 12 GB b") and not matches("error: a … b", "error: a 12 GB c")

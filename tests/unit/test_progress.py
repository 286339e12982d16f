"""What a run shows while it works: bars only on a terminal without --quiet, ETAs, the start-up summary block."""

import io
import re
from types import SimpleNamespace

from sage_grpo.config.train import TrainConfig
from sage_grpo.startup.plan import summary_lines
from sage_grpo.startup.resolve import subject_of
from sage_grpo.tracking.run_dir import MetricsLogger, eta_text, format_duration, show_progress_bars


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_the_main_process_on_a_terminal_without_quiet():
    assert show_progress_bars(True, False, Terminal())
    assert not show_progress_bars(True, False, io.StringIO())  # piped: no carriage-return redraws in the log
    assert not show_progress_bars(True, True, Terminal())  # --quiet
    assert not show_progress_bars(False, False, Terminal())  # other ranks


def test_durations_and_etas():
    assert [format_duration(s) for s in (0, 12.4, 65, 3725)] == ["0s", "12s", "1m05s", "1h02m"]
    assert eta_text(0, 10, 5.0) == ""  # no pace yet
    assert eta_text(4, 10, 20.0) == "eta 30s"  # 5 s per step, 6 steps left
    assert eta_text(10, 10, 50.0) == "eta 0s"


def test_console_lines_end_with_the_eta(tmp_path, capsys, monkeypatch):
    clock = iter([130.0, 190.0])
    monkeypatch.setattr("sage_grpo.tracking.run_dir.time.perf_counter", lambda: next(clock))
    logger = MetricsLogger(tmp_path, max_steps=8)
    # resumed after step 2: the pace counts from step 3, which started its 30 s of phase times before it was logged
    logger.log_step(3, {"gathered_avg_reward_mean": 0.5, "rollout_time": 30.0})
    logger.log_step(5, {"gathered_avg_reward_mean": 0.6})
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\[.*\] step 3 \| reward 0.5000 ± 0.0000 \| 30.0 s/step \| eta 2m30s", lines[0])
    assert lines[1].endswith("step 5 | reward 0.6000 ± 0.0000 | eta 1m30s")  # 90 s for 3 steps, 3 left
    assert (tmp_path / "train.log").read_text().splitlines() == lines


def test_startup_summary_names_run_model_reward_world_and_dtype(tmp_path):
    cfg = TrainConfig.of(remote_reward_url=None, reward_model="videoalign", use_lora=True, lora_r=8,
                         pretrained_model_root="ckpts", pretrained_transformer_version="480p_t2v",
                         reward_weights='{"VQ": 1.0}', dtype="bf16", max_steps=100, batch_size=2,
                         extra_rewards=None)
    layout = SimpleNamespace(world_size=8, dp_size=4, sp_size=2, videos_per_step=8)  # the plan's, batch 2 x dp 4

    def startup_summary(cfg, layout, run_dir, device):  # the first lines of the run's plan (RunPlan.lines)
        return summary_lines(subject_of(cfg), layout, device, run_dir)

    lines = startup_summary(cfg, layout, tmp_path, "cuda:0")
    assert lines == ["run summary:", f"  run directory  {tmp_path}",
                     "  model root     ckpts (transformer 480p_t2v, LoRA r 8)",
                     "  reward         local videoalign, weights {\"VQ\": 1.0}",
                     "  world          8 process(es) = dp 4 x sp 2 on cuda:0",
                     "  dtype          bf16", "  steps          to 100, 8 videos per step"]
    cfg.reward.extra_rewards = '{"clipscore": 0.5}'
    assert startup_summary(cfg, layout, tmp_path, "cpu")[3].endswith(', plus {"clipscore": 0.5}')
    cfg.reward.remote_reward_url = "http://10.0.0.2:8765"
    assert startup_summary(cfg, layout, tmp_path, "cpu")[3].startswith("  reward         remote http://10.0.0.2:8765 (")

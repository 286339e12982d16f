"""Experiment trackers (--report_to): parsing, the missing-package error before any model loads, the scalars, config
and videos each library receives (wandb and SwanLab offline, read back from their run files), and resume continuing
the same tracker run. A tracker whose package is not installed has its tests skipped."""
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.tracking.trackers import (RUN_IDS_FILE, LoggedVideo, TensorBoardTracker, TrackerRun,
                                         check_report_to, parse_report_to, start_trackers)
from sage_grpo.tracking.run_dir import MetricsLogger, read_metrics
from sage_grpo.video_io import write_video

from trackers_support import needs_wandb, read_record_log, wandb_run_when_written


needs_swanlab = pytest.mark.skipif(importlib.util.find_spec("swanlab") is None,
                                   reason="swanlab is not installed (pip install swanlab)")
METRICS = {"gathered_avg_reward_mean": 0.25, "kl_loss": 1e-3, "rollout_time": 2.0, "learning_rate": 1e-4}
TAGS = {"Reward/gathered_avg_reward_mean": 0.25, "KL/kl_loss": 1e-3, "Time/rollout_time": 2.0,
        "Train/learning_rate": 1e-4}


def swanlab_run(folder: Path) -> dict:
    """scalars {step: {key: value}}, media {step: {key: [(file name, caption)]}} and run id of a SwanLab run folder."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    scalars, media = {}, {}
    for raw in read_record_log(next(folder.glob("run-*.swanlab"))):
        record = Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "scalar":
            scalars.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
        elif kind == "media":
            items = [(item.filename, item.caption) for item in record.media.value.items]
            media.setdefault(record.media.step, {})[record.media.key] = items
    config = yaml.safe_load((folder / "files" / "config.yaml").read_text())
    return {"scalars": scalars, "media": media, "config": {k: v["value"] for k, v in config.items()},
            "id": folder.name.split("-", 2)[2]}


def tiny_video(path: Path) -> LoggedVideo:
    write_video(path, torch.linspace(0, 1, 3 * 3 * 8 * 8).reshape(3, 3, 8, 8), 8)
    return LoggedVideo(path, "a red disk (seed 7)", 8)


# ---------------------------------------------------------------- flags and packages
def test_report_to_forms():
    assert parse_report_to(["tensorboard"]) == ("tensorboard",)
    assert parse_report_to(["wandb,swanlab", "TensorBoard", "wandb"]) == ("wandb", "swanlab", "tensorboard")
    assert parse_report_to(["none"]) == ()
    assert parse_cli(TrainConfig, []).output.report_to == ["tensorboard"]
    assert parse_cli(TrainConfig, ["--report_to", "wandb", "tensorboard"]).output.report_to == ["wandb", "tensorboard"]
    for values, match in ((["none", "wandb"], "cannot be combined"), (["comet"], "'comet' is not a tracker"),
                          ([","], "is empty")):
        with pytest.raises(ConfigError, match=match):
            parse_report_to(values)


@pytest.mark.parametrize("name", ["wandb", "swanlab"])
def test_missing_tracker_package_names_the_install(monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what `import name` meets when the package is not installed
    with pytest.raises(ConfigError, match=rf"--report_to {name}: the {name} package cannot be imported .*"
                                          rf"pip install {name} \(or pip install 'sage-grpo\[{name}\]'\)"):
        check_report_to(["tensorboard", name])


# ---------------------------------------------------------------- what each tracker receives
class RecordingTracker:
    def __init__(self):
        self.calls = []

    def log_scalars(self, scalars, step):
        self.calls.append(("scalars", step, dict(scalars)))

    def log_videos(self, key, videos, step):
        self.calls.append(("videos", step, key, [v.caption for v in videos]))

    def finish(self):
        self.calls.append(("finish",))


def test_metrics_logger_sends_tagged_scalars_and_videos_and_always_writes_jsonl(tmp_path):
    tracker = RecordingTracker()
    logger = MetricsLogger(tmp_path, trackers=[tracker])
    logger.log_step(2, METRICS)
    logger.log_videos("Video/rollout", [LoggedVideo(tmp_path / "a.mp4", "a prompt", 8)], 2)
    logger.log_videos("Video/rollout", [], 3)  # nothing written, nothing sent
    logger.close()
    assert tracker.calls == [("scalars", 2, TAGS), ("videos", 2, "Video/rollout", ["a prompt"]), ("finish",)]
    assert read_metrics(tmp_path) == [{"step": 2, **METRICS}]
    (tmp_path / "none").mkdir()
    silent = MetricsLogger(tmp_path / "none", trackers=start_trackers(
        parse_report_to(["none"]), tmp_path / "none", project="p", run_name=None, config={}, resuming=False))
    silent.log_step(1, METRICS)  # --report_to none: metrics.jsonl only
    assert read_metrics(tmp_path / "none") == [{"step": 1, **METRICS}]
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["metrics.jsonl", "train.log"]


def test_tensorboard_tracker_writes_the_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(TrackerRun(tmp_path, "p", "run", {}, None))
    tracker.log_scalars(TAGS, 3)
    tracker.finish()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(TAGS)
    for tag, value in TAGS.items():
        (event,) = events.Scalars(tag)
        assert event.step == 3 and event.value == pytest.approx(value)


@needs_wandb
def test_wandb_offline_run_holds_scalars_config_videos_and_resumes(tmp_path, offline_trackers):
    video = tiny_video(tmp_path / "clip.mp4")
    config = {"sde_type": "sage_grpo", "kl_weight": 1e-5, "train_video_csv": ["a.csv"]}
    logger = MetricsLogger(tmp_path, trackers=start_trackers(["wandb"], tmp_path, project="sage-grpo-test",
                                                             run_name=None, config=config, resuming=False))
    for step in (1, 2):
        logger.log_videos("Video/rollout", [video], step)
        logger.log_step(step, {**METRICS, "kl_loss": step * 1e-3})
    logger.close()
    first_id = json.loads((tmp_path / RUN_IDS_FILE).read_text())["wandb"]
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    run = wandb_run_when_written(folder, last_step=2)
    assert run["id"] == first_id and {k: run["config"][k] for k in config} == config
    assert [run["history"][s]["KL/kl_loss"] for s in (1, 2)] == [1e-3, 2e-3]
    assert run["history"][2]["Reward/gathered_avg_reward_mean"] == 0.25
    logged = run["history"][1]  # a media list is stored as flattened keys under its name
    assert logged["Video/rollout/_type"] == "videos" and logged["Video/rollout/captions"] == ["a red disk (seed 7)"]
    assert len(list((folder / "files" / "media" / "videos").rglob("*.mp4"))) == 2

    resumed = start_trackers(["wandb"], tmp_path, project="sage-grpo-test", run_name=None, config=config,
                             resuming=True)  # e.g. --resume_from_checkpoint latest into the same --output_dir
    MetricsLogger(tmp_path, trackers=resumed).log_step(3, METRICS)
    resumed[0].finish()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))  # offline: one folder per start, the same run id
    # both folders carry the run id; wandb appends "-1" to the second when both starts fall in the same second
    assert len(runs) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first_id}(-\d+)?", run.name)
                                  for run in runs), [run.name for run in runs]
    second = wandb_run_when_written(runs[1], last_step=3)
    assert second["id"] == first_id and 3 in second["history"]


@needs_swanlab
def test_swanlab_offline_run_holds_scalars_config_gifs_and_resumes(tmp_path, offline_trackers):
    video = tiny_video(tmp_path / "clip.mp4")
    config = {"sde_type": "sage_grpo", "kl_weight": 1e-5}
    logger = MetricsLogger(tmp_path, trackers=start_trackers(["swanlab"], tmp_path, project="sage-grpo-test",
                                                             run_name="named", config=config, resuming=False))
    logger.log_step(1, METRICS)
    logger.log_videos("Video/validation", [video], 1)
    logger.close()
    first_id = json.loads((tmp_path / RUN_IDS_FILE).read_text())["swanlab"]
    (folder,) = (tmp_path / "swanlog").glob("run-*")
    run = swanlab_run(folder)
    assert run["id"] == first_id and run["config"] == config
    assert run["scalars"] == {1: TAGS}
    ((name, caption),) = run["media"][1]["Video/validation"]
    assert caption == "a red disk (seed 7)" and (next(folder.glob(f"media/**/{name}"))).read_bytes()[:6] == b"GIF89a"

    resumed = start_trackers(["swanlab"], tmp_path, project="sage-grpo-test", run_name="named", config=config,
                             resuming=True)
    resumed[0].finish()
    assert sorted(swanlab_run(f)["id"] for f in (tmp_path / "swanlog").glob("run-*")) == [first_id, first_id]

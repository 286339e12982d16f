"""The drift proxy and guard in real (tiny) runs: the golden run with the proxy measured at every step keeps its
training numbers bit for bit (the validation and the proxy draw from no generator the training uses), ``--drift_guard
stop`` saves and stops naming the bound, and the guard's state survives the resume."""
import json

import pytest
from model_fixtures import tiny_args
from test_golden import FLAGS, GOLDEN, differences, machine

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.pipeline import drift
from sage_grpo.safe_io import load_plain
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics, training_rows, validation_rows
from sage_grpo.trainer import GRPOTrainer

GUARD = ("--max_steps", "2", "--validation_interval", "1", "--validation_fixed_size", "16x16",
         "--validate_video_length", "5", "--validation_num_inference_steps", "2", "--save_interval", "1000")


def golden_rows():
    recordings = json.loads(GOLDEN.read_text())["recordings"]
    mine = [r for r in recordings if r["written_on"] == machine()]
    return (mine or recordings)[0]["rows"], bool(mine)


def test_the_guard_stops_resumes_and_leaves_the_training_numbers_alone(tiny_root, tmp_path, monkeypatch):
    measured = drift.DriftProxyMetric.__call__
    scale = {0: 1.0, 1: 10.0, 2: 1.0}  # the real proxy, made to cross the bound at step 1

    def forced(self, samples):
        return {"drift_proxy": measured(self, samples)["drift_proxy"] * scale[samples.step]}

    monkeypatch.setattr(drift.DriftProxyMetric, "__call__", forced)
    run = tmp_path / "run"
    trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, run, *FLAGS, *GUARD, "--drift_guard", "stop")))
    assert trainer.models.base is not None  # the moving anchor: the proxy holds a frozen copy of the base
    stopped = (r"^--drift_guard stop stopped the run at step 1: drift proxy .* is \d+\.\d\dx its baseline .* "
               r"\(bound --drift_guard_proxy_ratio 8\)\. The weights of this step are in .*checkpoint-1$")
    with pytest.raises(drift.DriftGuardStop, match=stopped):
        trainer.train()
    state = load_plain(run / "checkpoint-1" / "training_state.pt", "training state")["drift_guard"]
    ratios = [row["Validation/drift_proxy_ratio"] for row in validation_rows(read_metrics(run))]
    assert [row["step"] for row in validation_rows(read_metrics(run))] == [0, 1]
    assert ratios[0] == 1.0 and ratios[1] > 2.0 and state["last_clean_step"] == 0
    first = validation_rows(read_metrics(run))[1]  # the alarm's point: no notice, each score with its spread
    assert (first["Validation/drift_guard_notices"], first["Validation/drift_guard_alarms"]) == (0.0, 1.0)
    spreads = {k[len("ValidationSpread/"):] for k in first if k.startswith("ValidationSpread/")}
    assert "avg" in spreads and all("Validation/" + key in first for key in spreads)

    resumed = GRPOTrainer(parse_cli(TrainConfig, tiny_args(tiny_root, run, *FLAGS, *GUARD, "--drift_guard", "warn",
                                                           "--resume_from_checkpoint", "latest")))
    resumed.train()  # step 2 against the step-0 baseline of the checkpoint, not a new one
    assert resumed.sentinel.guard.proxy_baseline == state["proxy_baseline"]
    rows = read_metrics(run)
    last = validation_rows(rows)[-1]
    assert last["step"] == 2 and last["Validation/drift_proxy"] == pytest.approx(
        last["Validation/drift_proxy_ratio"] * state["proxy_baseline"], rel=1e-12)

    training = [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in training_rows(rows)]
    expected, exact = golden_rows()
    assert [row["step"] for row in training] == [1, 2]
    assert not differences(training, expected, exact)  # the golden run's numbers, the guard and a resume between

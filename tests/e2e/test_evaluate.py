"""python -m sage_grpo.evaluate end to end, in-process, on the tiny checkpoint: 3 checkpoints (base, a training
checkpoint-N, a bare weights file) x 4 prompts x 2 seeds at 2 sampling steps; the outputs hold what they claim, and
an interrupted then resumed evaluation equals an uninterrupted one without sampling a cached unit again."""

import json
import math

import pytest
import torch
from eval_support import PROMPTS, make_eval_setup, scores_only
from PIL import Image
from transformers import CLIPConfig

from sage_grpo.config.schema import parse_cli
from sage_grpo.evaluate import main
from sage_grpo.evaluate.command import run_evaluation
from sage_grpo.evaluate.config import EvaluateConfig
from sage_grpo.evaluate.plan import plan_evaluation

CLIP_SCALE = math.exp(CLIPConfig().logit_scale_init_value)  # the tiny CLIP's exp(logit_scale), 14.3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny shapes gain nothing from intra-op threads; on a loaded 2-core machine the 2 of conftest.py made these
    runs 15x slower (measured: 254 s against 17 s for one evaluation)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(tiny_root, tiny_reward_root, tmp_path_factory):
    return make_eval_setup(tiny_root, tiny_reward_root, tmp_path_factory.mktemp("evaluate"))


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    output = tmp_path_factory.mktemp("uninterrupted")
    assert main([*setup["args"], "--output", str(output)]) == 0
    return output, json.loads((output / "results.json").read_text())


def test_outputs(setup, uninterrupted):
    output, results = uninterrupted
    assert results["settings"]["num_inference_steps"] == 2 and results["seeds"] == [3, 7]
    assert list(results["checkpoints"]) == setup["checkpoints"]
    for entry in results["checkpoints"].values():
        assert list(entry["prompts"]) == list(PROMPTS)
        samples = [scores for prompt in entry["prompts"].values() for scores in prompt["seeds"].values()]
        assert len(samples) == 8 and entry["summary"]["VQ"]["n"] == 8
        for scores in samples:  # the paper's Overall, and the default weights {"VQ": 0.5, "MQ": 0.5, "TA": 1.0}
            assert scores["Overall"] == pytest.approx(scores["VQ"] + scores["MQ"] + scores["TA"], abs=1e-5)
            assert scores["Weighted"] == pytest.approx(0.5 * scores["VQ"] + 0.5 * scores["MQ"] + scores["TA"])
            assert 0 <= scores["clipscore"] <= 2.5 and scores["clipscore"] >= 2.5 * scores["clip_cosine"]
            assert scores["clip_flowgrpo"] == pytest.approx(CLIP_SCALE * scores["clip_cosine"] / 30, abs=1e-6)
            assert {"toy_red", "toy_red_manifold_error", "toy_red_prompt_adherence", "target_color"} <= set(scores)
        first = entry["prompts"][PROMPTS[0]]
        assert first["mean"]["pickscore"] == pytest.approx(sum(s["pickscore"] for s in first["seeds"].values()) / 2)
    base, trained = (results["checkpoints"][label]["summary"]["clip_cosine"]["mean"] for label in
                     setup["checkpoints"][:2])
    assert base != trained  # the trained weights were loaded
    for entry in results["checkpoints"].values():  # Table 2's PickScore scale beside the raw logit
        summary = entry["summary"]
        assert summary["pickscore_paper"]["mean"] == pytest.approx(summary["pickscore"]["mean"] / 26)
        assert summary["pickscore_paper"]["stderr"] == pytest.approx(summary["pickscore"]["stderr"] / 26)
    assert {"clipscore", "clip_flowgrpo", "pickscore_paper", "pickscore"} <= set(results["metric_definitions"])
    table = (output / "results.md").read_text().splitlines()
    assert table[2].startswith("| Model | VQ | MQ | TA | Overall | CLIPScore (2.5·max(cos,0)) | CLIP score (logit/30) | "
                               "PickScore (logit/26) | PickScore logit (raw) |")
    assert len(table) == 4 + 3
    pictures = sorted((output / "side_by_side").glob("*.png"))
    assert len(pictures) == 4 and Image.open(pictures[0]).height == 20 + 3 * (16 + 4)  # a row per checkpoint
    assert Image.open(output / "bars.png").width > 0


def test_interrupted_and_resumed_equals_uninterrupted(setup, uninterrupted, tmp_path):
    output = tmp_path / "resumed"
    config = parse_cli(EvaluateConfig, [*setup["args"], "--output", str(output)])
    assert run_evaluation(config, plan_evaluation(config), stop_after=11) is None  # stops inside checkpoint 2
    cached = {path: path.stat().st_mtime_ns for path in (output / "cache").rglob("*_seed*.json")}
    assert len(cached) == 11 and not (output / "results.json").exists()
    assert main([*setup["args"], "--output", str(output)]) == 0
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in cached.items())  # not sampled again
    assert len(list((output / "cache").rglob("*_seed*.json"))) == 24
    assert scores_only(json.loads((output / "results.json").read_text())) == scores_only(uninterrupted[1])


def test_other_settings_are_refused_not_mixed(setup, uninterrupted, capsys):
    output, _ = uninterrupted
    args = [*setup["args"], "--output", str(output)]
    args[args.index("--num_inference_steps") + 1] = "3"
    assert main(args) == 2
    assert "holds results sampled or scored with other settings (differ: num_inference_steps)" in \
        capsys.readouterr().err

"""python -m sage_grpo.evaluate refuses bad input in one line before any model loads (no checkpoint root is even
needed for most of them), and its reports follow Table 2's layout with the mean ± standard error arithmetic."""

import math

import pytest

from sage_grpo.evaluate import main
from sage_grpo.evaluate.report import METRIC_DEFINITIONS, markdown_table, mean_and_stderr, with_paper_scale


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "eval.csv"
    path.write_text("prompt\nA cat walks\n")
    return path


def refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_missing_checkpoint(tmp_path, prompts, capsys):
    err = refused(capsys, ["--checkpoints", "base", str(tmp_path / "run" / "checkpoint-9"), "--prompts", str(prompts),
                           "--metrics", "target_color", "--model_path", str(tmp_path)])
    assert "checkpoint-9: no such file or directory (or use 'base')" in err


def test_unknown_metric(tmp_path, prompts, capsys):
    err = refused(capsys, ["--checkpoints", "base", "--prompts", str(prompts), "--metrics", "clipscore,fid",
                           "--model_path", str(tmp_path)])
    assert "unknown metric 'fid'" in err and "videoalign, clipscore, pickscore" in err


def test_empty_csv_and_missing_csv(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("prompt\n")
    common = ["--checkpoints", "base", "--metrics", "target_color", "--model_path", str(tmp_path)]
    assert "empty.csv" in refused(capsys, [*common, "--prompts", str(empty)])
    assert "does not exist" in refused(capsys, [*common, "--prompts", str(tmp_path / "none.csv")])
    assert "--prompts is required" in refused(capsys, common)


def test_missing_scorer_models_and_transformer(tmp_path, prompts, capsys):
    common = ["--checkpoints", "base", "--prompts", str(prompts), "--model_path", str(tmp_path)]
    assert "--clip_model openai/clip-vit-large-patch14" in refused(capsys, [*common, "--metrics", "clipscore"])
    assert "VideoReward" in refused(capsys, [*common, "--metrics", "videoalign"])
    assert "no transformer 480p_t2v" in refused(capsys, [*common, "--metrics", "target_color"])


def test_bad_weights_and_seeds(tmp_path, prompts, capsys):
    common = ["--checkpoints", "base", "--prompts", str(prompts), "--model_path", str(tmp_path), "--metrics",
              "target_color"]
    assert "not VideoAlign metrics" in refused(capsys, [*common, "--reward_weights", '{"VQ": 1, "XX": 2}'])
    assert "distinct seeds" in refused(capsys, [*common, "--seeds", "1", "1"])
    assert "names one twice" in refused(capsys, ["--checkpoints", "base", "base", *common[2:]])


def test_mean_and_standard_error():
    stat = mean_and_stderr([1.0, 2.0, 4.0])
    # mean 7/3; sample variance ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3; s.e. = sqrt(7/3 / 3)
    assert stat["mean"] == pytest.approx(7 / 3) and stat["stderr"] == pytest.approx(math.sqrt(7 / 9))
    assert mean_and_stderr([5.0]) == {"mean": 5.0, "stderr": None, "n": 1, "failed": 0}
    # a failed score (None) is counted and left out of the mean and its error
    assert mean_and_stderr([1.0, None, 4.0]) == {"mean": 2.5, "stderr": pytest.approx(1.5), "n": 2, "failed": 1}
    assert mean_and_stderr([None]) == {"mean": None, "stderr": None, "n": 0, "failed": 1}


def test_markdown_is_table2_first():
    def entry(**means):
        return {"summary": {k: {"mean": v, "stderr": 0.5, "n": 2} for k, v in means.items()}}

    results = {"settings": {"sampler": "Euler", "num_inference_steps": 40, "height": 480, "width": 848,
                            "video_length": 121, "guidance_scale": 6.0, "flow_shift": 5.0, "dtype": "bf16"},
               "prompts": ["a"], "seeds": [0, 1],
               "checkpoints": {"base": entry(toy_red=1.0, pickscore=21.0, VQ=-0.75, MQ=-0.59, TA=1.41,
                                             Overall=0.07, clipscore=0.8)}}
    lines = markdown_table(results).splitlines()
    assert lines[2] == "| Model | VQ | MQ | TA | Overall | CLIPScore (2.5·max(cos,0)) | PickScore logit (raw) | toy_red |"
    assert lines[4].startswith("| base | -0.7500 ± 0.5000 | -0.5900 ± 0.5000 | 1.4100 ± 0.5000 | 0.0700 ± 0.5000 |")
    assert "40 steps" in lines[0]


def test_paper_scale_pickscore_is_flow_grpos_logit_over_26():
    # Table 2's PickScore 0.74 is a logit of 19.24 (PickScore_v1: 100 cos, cos 0.19) on Flow-GRPO's scale
    scores = with_paper_scale({"pickscore": 19.24, "clipscore": 0.54, "clip_flowgrpo": 0.72, "clip_cosine": 0.216})
    assert scores["pickscore_paper"] == pytest.approx(0.74) and scores["clipscore"] == 0.54
    assert with_paper_scale({"VQ": 1.0}) == {"VQ": 1.0}  # nothing to derive without PickScore
    assert with_paper_scale({"pickscore": None})["pickscore_paper"] is None  # a failed score stays failed
    results = {"settings": {"sampler": "Euler", "num_inference_steps": 40, "height": 480, "width": 848,
                            "video_length": 121, "guidance_scale": 6.0, "flow_shift": 5.0, "dtype": "bf16"},
               "prompts": ["a"], "seeds": [0],
               "checkpoints": {"base": {"summary": {k: {"mean": v, "stderr": None, "n": 1} for k, v in scores.items()}}}}
    lines = markdown_table(results).splitlines()
    assert lines[2] == ("| Model | CLIPScore (2.5·max(cos,0)) | CLIP score (logit/30) | PickScore (logit/26) | "
                        "PickScore logit (raw) | CLIP cos (raw) |")
    assert "two candidate scalings of Table 2's CLIPScore" in lines[0] and "hold those against Table 2" in lines[0]
    assert lines[4] == "| base | 0.5400 | 0.7200 | 0.7400 | 19.2400 | 0.2160 |"
    # results.json's metric_definitions name each CLIP column's formula
    assert "mean over frames of 2.5 * max(cos, 0)" in METRIC_DEFINITIONS["clipscore"]
    assert "logit / 30 = exp(logit_scale) * cos / 30" in METRIC_DEFINITIONS["clip_flowgrpo"]


def test_bar_chart_draws_each_bar_in_its_colour(tmp_path):
    from PIL import Image

    from sage_grpo.tracking.plots import COLOURS, BarPanel, plot_bars

    path = plot_bars([BarPanel("VQ", ["base", "run"], [1.0, -0.5], [0.1, 0.0])], tmp_path / "bars.png", columns=1,
                     panel_width=300, panel_height=260)
    image = Image.open(path).convert("RGB")
    colours = {image.getpixel((x, y)) for x in range(image.width) for y in range(40, image.height)}
    assert COLOURS[0] in colours and COLOURS[1] in colours and image.size[0] == 300


def test_bar_chart_legend_shows_long_checkpoint_labels_whole(tmp_path):
    from PIL import Image, ImageDraw

    from sage_grpo.tracking.plots import BarPanel, plot_bars

    long = "/scratch/someone/sage_grpo_runs/outputs/run_2026_11_25_sage_dual_kl/checkpoint-1000"
    path = plot_bars([BarPanel("Overall", ["base", long], [1.0, 2.0], [0.1, 0.1])], tmp_path / "bars.png",
                     title="mean ± standard error per checkpoint", columns=3)
    image = Image.open(path).convert("L")
    text_width = ImageDraw.Draw(image).textlength(long)
    row = range(30 + 16, 30 + 16 + 14)  # the legend's second line: title 30 px, then 16 px a name
    inked = [x for x in range(28, image.width) for y in row if image.getpixel((x, y)) < 128]
    assert max(inked) >= 28 + text_width - 4  # the label is drawn to its last character ...
    assert max(inked) <= image.width - 8  # ... inside the picture, with its margin


def test_bar_chart_of_an_all_nan_and_an_all_zero_metric(tmp_path):
    """Before: a ZeroDivisionError traceback after results.json (a 0-high axis), and no picture."""
    from PIL import Image

    from sage_grpo.tracking.plots import COLOURS, BarPanel, plot_bars

    path = plot_bars([BarPanel("failed everywhere", ["base", "run"], [math.nan, math.nan], [0.0, 0.0]),
                      BarPanel("zero everywhere", ["base", "run"], [0.0, 0.0], [0.0, 0.0])], tmp_path / "bars.png",
                     columns=2)
    image = Image.open(path).convert("RGB")
    assert image.width == 600
    left = {image.getpixel((x, y)) for x in range(300) for y in range(image.height - 260, image.height)}  # panel 1
    assert not {COLOURS[0], COLOURS[1]} & left  # no bar where there is no value ...
    assert any(r > 150 and g < 60 and b < 60 for r, g, b in left)  # ... but "NaN", in red, in each bar's place


def test_a_metric_that_failed_on_every_sample_is_named_nan_in_the_table():
    results = {"settings": {"sampler": "Euler", "num_inference_steps": 40, "height": 480, "width": 848,
                            "video_length": 121, "guidance_scale": 6.0, "flow_shift": 5.0, "dtype": "bf16"},
               "prompts": ["a", "b"], "seeds": [0],
               "checkpoints": {"base": {"summary": {"toy_red": mean_and_stderr([None, None]),
                                                    "brightness": mean_and_stderr([0.0, 0.0])}}}}
    assert markdown_table(results).splitlines()[4] == "| base | NaN (2 of 2 failed) | 0.0000 ± 0.0000 |"


def test_repeated_prompts_are_evaluated_once_and_named():
    from sage_grpo.evaluate.plan import unique_prompts

    assert unique_prompts(["a", "b"]) == (["a", "b"], None)
    prompts, line = unique_prompts(["a cat", "a dog", "a cat", "a cow", "a dog", "a cat"])
    assert prompts == ["a cat", "a dog", "a cow"]
    assert line == ("2 prompt(s) repeated, each evaluated once (3 distinct prompts of 6 rows): 'a cat' (3 rows); "
                    "'a dog' (2 rows)")

"""The evaluation's inputs: every checkpoint checked as loadable before the first video; its cache keyed by the
weights' content; failed scores counted, never a crash nor a bare NaN in results.json; a cache entry that is
unreadable, foreign or of other weights sampled again; a cache folder that is not this project's named in one line;
no write inside an input; per-writer temporary names; a prompt repeated in the CSV evaluated once; a metric that
failed on every sample (NaN) or is 0.0 everywhere tabulated and drawn.

On the tiny checkpoint at 1 sampling step, 5 frames of 16x16, two checkpoints x three prompts (one of them on two
rows) x one seed, scored with a toy reward and plug-ins that fail on one prompt, on every prompt, and score 0.0
(about 5 s in all on the 2-core machine).
"""

import json
import os
import pickle
import re
import sys

import pytest
import torch
from safetensors.torch import save_file
from trust_support import write_module

from sage_grpo.evaluate import main

PROMPTS = ("A red ball bounces", "A cat walks on the grass", "This prompt fails the plug-in")
PLUGIN = "eval_trust_plugin:sometimes_nan"
PLUGIN_KEY = f"{PLUGIN}_score"
PLUGIN_SOURCE = """import math

import torch

from sage_grpo.rewards import reward_plugin


@reward_plugin
def sometimes_nan(videos, prompts):
    return {"score": torch.tensor([math.nan if "fails" in p else float(videos.mean()) for p in prompts])}


@reward_plugin
def always_nan(videos, prompts):
    return {"score": torch.full((len(prompts),), math.nan)}


@reward_plugin
def always_zero(videos, prompts):
    return {"score": torch.zeros(len(prompts))}
"""
NEVER, ZERO = "eval_trust_plugin:always_nan_score", "eval_trust_plugin:always_zero_score"  # all NaN, all 0.0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes gain nothing from threads on a busy 2-core machine
    yield
    torch.set_num_threads(before)


def _trained(tiny_root, path, seed: int):
    from sage_grpo.models import load_transformer

    state = load_transformer(tiny_root, dtype=torch.float32).state_dict()
    generator = torch.Generator().manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in state.items()}, path)


@pytest.fixture
def setup(tiny_root, tmp_path, monkeypatch):
    write_module(tmp_path, "eval_trust_plugin", PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = tmp_path / "run" / "checkpoint-2"
    _trained(tiny_root, checkpoint / "transformer" / "model.safetensors", seed=0)
    (tmp_path / "eval.csv").write_text("prompt\n" + "\n".join(PROMPTS + PROMPTS[1:2]) + "\n")  # one row repeated
    args = ["--checkpoints", "base", str(checkpoint), "--prompts", str(tmp_path / "eval.csv"), "--seeds", "0",
            "--metrics", f"target_color,{PLUGIN},{NEVER[:-6]},{ZERO[:-6]}", "--model_path", str(tiny_root),
            "--num_inference_steps", "1", "--video_length", "5", "--fixed_size", "16x16", "--text_max_length", "16",
            "--byt5_max_length", "8", "--vision_num_semantic_tokens", "4", "--dtype", "fp32", "--device", "cpu",
            "--picture_height", "16", "--output", str(tmp_path / "eval")]
    yield {"root": tiny_root, "checkpoint": checkpoint, "args": args, "output": tmp_path / "eval"}
    sys.modules.pop("eval_trust_plugin", None)


def _strict(text: str) -> dict:
    """results.json parsed as strict JSON: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in results.json"))


def test_failed_scores_are_counted_and_the_cache_is_keyed_by_content(setup, capsys, monkeypatch):
    from sage_grpo.export.identity import weights_digest
    from sage_grpo.pipeline.generation import VideoGenerator

    rendered = []
    real_render = VideoGenerator.render
    monkeypatch.setattr(VideoGenerator, "render", lambda self, item: rendered.append(item.prompt) or
                        real_render(self, item))
    checkpoint, output = setup["checkpoint"], setup["output"]
    assert main(setup["args"]) == 0  # the plug-in's NaN crashed the report after the whole run
    out = capsys.readouterr().out
    assert len(rendered) == 6 and "warning: scores failed" in out  # the repeated row sampled the cache's units twice
    assert (f"note: --prompts {output.parent / 'eval.csv'}: 1 prompt(s) repeated, each evaluated once (3 distinct "
            f"prompts of 4 rows): {PROMPTS[1]!r} (2 rows)") in out.splitlines()
    first = _strict((output / "results.json").read_text())
    assert first["prompts"] == list(PROMPTS)
    for label in ("base", str(checkpoint)):
        entry = first["checkpoints"][label]
        assert {k: entry["summary"][PLUGIN_KEY][k] for k in ("n", "failed")} == {"n": 2, "failed": 1}
        assert entry["prompts"][PROMPTS[2]]["seeds"]["0"][PLUGIN_KEY] is None  # null, never a bare NaN
        assert entry["summary"]["target_color"]["failed"] == 0 and entry["summary"]["target_color"]["n"] == 3
        assert entry["summary"][NEVER] == {"mean": None, "stderr": None, "n": 0, "failed": 3}
        assert entry["summary"][ZERO] == {"mean": 0.0, "stderr": 0.0, "n": 3, "failed": 0}
    table = (output / "results.md").read_text()
    assert table.count(" (1 failed) |") == 2 and table.count(" NaN (3 of 3 failed) |") == 2
    assert table.count(" 0.0000 ± 0.0000 |") == 2
    _assert_nan_drawn(output / "bars.png")  # an all-NaN and an all-0.0 metric stopped the bars with a traceback
    assert first["checkpoints"][str(checkpoint)]["weights_sha256"] == weights_digest(checkpoint)

    records = {json.loads(p.read_text())["prompt"]: p for p in (output / "cache").glob("base-*/*.json")}
    records[PROMPTS[0]].write_text(records[PROMPTS[2]].read_text())  # another prompt's record under this name
    records[PROMPTS[1]].with_suffix(".png").write_bytes(b"\x89PNG garbage")
    _trained(setup["root"], checkpoint / "transformer" / "model.safetensors", seed=1)  # a rerun's new weights
    (output.parent / "eval.csv").write_text("prompt\n" + "\n".join(PROMPTS[::-1]) + "\n")  # rows reordered
    rendered.clear()
    assert main(setup["args"]) == 0
    out = capsys.readouterr().out
    # base's intact unit is kept: the cache is keyed by the prompt's text, not its row
    assert sorted(rendered) == sorted([PROMPTS[0], PROMPTS[1], *PROMPTS])
    assert "note: 1 cached unit(s) of base are sampled again: another prompt" in out
    assert "note: 1 cached unit(s) of base are sampled again: unreadable (UnidentifiedImageError)" in out
    assert f"note: 3 cached unit(s) of {checkpoint} are sampled again: weights changed since it was sampled" in out
    second = _strict((output / "results.json").read_text())
    assert second["prompts"] == list(PROMPTS[::-1])
    assert second["checkpoints"]["base"]["prompts"] == first["checkpoints"]["base"]["prompts"]  # each in its place
    for key, stat in first["checkpoints"]["base"]["summary"].items():  # the same samples, summed in another order
        assert second["checkpoints"]["base"]["summary"][key] == pytest.approx(stat), key
    new, old = (r["checkpoints"][str(checkpoint)]["summary"]["target_color"]["mean"] for r in (second, first))
    assert new != old  # served the old scores before


def _assert_nan_drawn(path) -> None:
    """The picture holds "NaN" text, in its colour (the font's smoothing shades its edges), as no other pixel is."""
    import numpy as np
    from PIL import Image

    from sage_grpo.tracking.plots import NAN_COLOUR

    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert (np.abs(pixels - np.array(NAN_COLOUR)).max(axis=-1) < 20).sum() > 20


def test_checkpoints_are_checked_as_loadable_before_any_video(setup, capsys, monkeypatch):
    monkeypatch.setattr("sage_grpo.pipeline.generation.VideoGenerator",
                        lambda *args: pytest.fail("sampling started before every checkpoint was checked"))
    weights = setup["checkpoint"] / "transformer" / "model.safetensors"
    cases = [(pickle.dumps({"w": [1, 2]}), "cannot read trained weights"),
             (None, r"the weights in .* do not fit the transformer: missing keys \(\d+\): ")]
    for content, match in cases:
        if content is None:
            save_file({"w": torch.ones(2)}, weights)
        else:
            weights.write_bytes(content)
        assert main(setup["args"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and re.search(rf"error: --checkpoints .*{match}", err)
    assert not setup["output"].exists()


def test_the_output_folder_is_checked_before_anything_loads(setup, capsys):
    args = setup["args"][:-2]
    cases = [(setup["checkpoint"] / "eval", f"--output {setup['checkpoint'] / 'eval'} lies inside --checkpoints "),
             (setup["root"] / "eval", "lies inside --model_path")]
    (setup["output"] / "cache").mkdir(parents=True)
    (setup["output"] / "cache" / "settings.json").write_text('{"truncated": ')
    cases.append((setup["output"], "cannot read the evaluation cache's settings "
                                   f"{setup['output'] / 'cache' / 'settings.json'}: Expecting value"))
    (setup["checkpoint"].parent / "a_file").write_text("x")
    cases.append((setup["checkpoint"].parent / "a_file", "is a file; pass a folder"))
    for output, match in cases:
        assert main([*args, "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err
    assert not (setup["checkpoint"] / "eval").exists() and not (setup["root"] / "eval").exists()


def test_each_writer_has_its_own_temporary_names(tmp_path, monkeypatch):
    import numpy as np

    from sage_grpo.safe_io import writing
    from sage_grpo.evaluate.runner import write_unit

    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(writing.os, "replace", lambda a, b: renamed.append(os.path.basename(a)) or real_replace(a, b))
    write_unit(tmp_path / "unit.json", {"scores": {}}, np.zeros((4, 4, 3), dtype=np.uint8))
    assert renamed == [f".unit.png.tmp-{os.getpid()}", f".unit.json.tmp-{os.getpid()}"]  # was one shared .partial

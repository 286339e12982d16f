"""generate.py's --output_path: an existing folder or a path without extension is a folder of sample_*.mp4 files
(before: a traceback from the video writer after sampling, nothing written); another extension, and an existing file
where a folder is needed, are refused in one line naming a valid path before any model loads; files replaced at
the planned names are named first. The videos come from a stand-in generator (the paths are what is tested)."""

import pytest
import torch

from sage_grpo.cli.generate import main
from sage_grpo.pipeline import generation

pytestmark = pytest.mark.unit


class _Grey:
    """Stands in for the model: a mid-grey 5-frame 16x16 video per prompt."""

    def __init__(self, config, plan):
        pass

    def render(self, item, progress=False):
        return torch.full((3, 5, 16, 16), 0.5)


@pytest.fixture
def argv(tiny_root, monkeypatch):
    monkeypatch.setattr(generation, "VideoGenerator", _Grey)
    return ["--model_path", str(tiny_root), "--prompt", "a cat", "--device", "cpu", "--fixed_size", "16x16",
            "--video_length", "5"]


def test_an_existing_folder_or_a_name_without_extension_is_a_folder(argv, tmp_path, capsys):
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert main([*argv, "--output_path", str(folder)]) == 0  # before: IsADirectoryError-like traceback, exit 1
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "sample_000_seed_930_a cat.mp4",
                                                        "sample_000_seed_930_a cat_config.json"]
    assert (folder / "notes.txt").read_text() == "mine"
    assert f"saved {folder / 'sample_000_seed_930_a cat.mp4'}" in capsys.readouterr().out

    named = tmp_path / "out" / "cat"  # a name without extension: before, the writer found no format for it
    assert main([*argv, "--output_path", str(named)]) == 0
    assert (named / "sample_000_seed_930_a cat.mp4").stat().st_size > 0


def test_another_extension_or_a_file_in_the_folders_place_is_refused(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generation, "VideoGenerator", lambda *a: pytest.fail("a model loaded for a bad path"))
    kept = tmp_path / "cat"
    kept.write_text("a file of the user's")
    cases = [(tmp_path / "cat.gif", f"error: --output_path {tmp_path / 'cat.gif'}: .gif is not a video file name; "
                                     f"videos are written as mp4: pass {tmp_path / 'cat.mp4'} (one video) or a "
                                     f"folder, {tmp_path / 'cat.gif'}/"),
             (kept, f"error: --output_path {kept}: {kept} is an existing file, not a folder to write the videos into; "
                    f"pass {kept}.mp4 for one video, or a new folder such as {kept}_videos/")]
    for path, line in cases:
        assert main([*argv, "--output_path", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == line
    assert kept.read_text() == "a file of the user's" and sorted(p.name for p in tmp_path.iterdir()) == ["cat"]


def test_files_replaced_at_the_planned_names_are_named_first(argv, tmp_path, capsys):
    video = tmp_path / "cat.mp4"
    assert main([*argv, "--output_path", str(video)]) == 0
    assert "existing file(s) replaced" not in capsys.readouterr().out
    assert main([*argv, "--output_path", str(video)]) == 0  # the same command again: its own files are replaced
    out = capsys.readouterr().out.splitlines()
    note = f"note: --output_path: 2 existing file(s) replaced: '{video}, {tmp_path / 'cat_config.json'}'"
    assert note in out and out.index(note) < next(i for i, line in enumerate(out) if line.startswith("[1/1]"))

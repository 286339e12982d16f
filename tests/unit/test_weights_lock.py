"""weights.lock.json: commits resolved and recorded, a lock file winning over the revision, the run's record of its
weights (run_config.yaml comments that --config still reads, a copy in the run directory) and the model card's."""

import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from procs import run_group

from sage_grpo.config.train import TrainConfig
from sage_grpo.config.schema import parse_cli, save_yaml
from sage_grpo.export.model_card import model_card
from sage_grpo.models import revisions

REPO, OTHER = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v", "KwaiVGI/VideoReward"
COMMIT, OTHER_COMMIT = "abc123" + "0" * 34, "def456" + "0" * 34  # the hub's commit ids have 40 hex digits


def hub_commit(repo: str, revision: str) -> str:
    return hashlib.sha1(f"{revision}@{repo}".encode()).hexdigest()


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub's model_info answering every revision with a commit derived from it; the calls are kept."""
    calls = []

    def model_info(self, repo, revision=None):
        calls.append((repo, revision))
        return SimpleNamespace(sha=hub_commit(repo, revision))

    monkeypatch.setattr("huggingface_hub.HfApi.model_info", model_info)
    return calls


def test_resolve_record_and_a_lock_file_that_wins(tmp_path, hub):
    assert revisions.resolve(REPO, "main") == hub_commit(REPO, "main")
    path = revisions.record(tmp_path, REPO, "main", COMMIT)
    revisions.record(tmp_path, OTHER, "v1.0", OTHER_COMMIT)
    assert json.loads(path.read_text()) == {OTHER: {"revision": "v1.0", "commit": OTHER_COMMIT},
                                            REPO: {"revision": "main", "commit": COMMIT}}
    assert revisions.resolve(REPO, "main", lock=str(path)) == COMMIT and len(hub) == 1  # no hub call
    assert revisions.resolve("someone/else", "main", lock=str(path)) == hub_commit("someone/else", "main")  # not locked
    again = tmp_path / "again"
    revisions.record(again, REPO, "main", COMMIT, lock_file=str(path))  # keeps the lock's revision name
    assert json.loads((again / revisions.LOCK_FILE).read_text())[REPO]["revision"] == "main"
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="the weights lock file .*bad.json holds a JSON list, not an object"):
        revisions.read_lock(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text('{"a/b": [1]}')
    with pytest.raises(ValueError, match="bad.json is not a weights lock file"):
        revisions.read_lock(tmp_path / "bad.json")
    assert revisions.main(["resolve", REPO, "main", "--lock", str(tmp_path / "bad.json")]) == 2


def test_a_run_records_its_weights_and_the_card_shows_them(tmp_path):
    root, run = tmp_path / "ckpts", tmp_path / "run"
    run.mkdir()
    assert revisions.record_run_weights(root, run, run / "run_config.yaml") == []  # no lock: nothing recorded
    revisions.record(root, REPO, "main", COMMIT)
    cfg = parse_cli(TrainConfig, ["--pretrained_model_root", str(root), "--kl_weight", "0"])
    save_yaml(cfg, run / "run_config.yaml")
    lines = revisions.record_run_weights(root, run, run / "run_config.yaml")
    assert lines == [f"{REPO}@{COMMIT} (main)"]
    text = (run / "run_config.yaml").read_text()
    assert text.endswith(f"# weights, from {root / 'weights.lock.json'}:\n#   {REPO}@{COMMIT} (main)\n")
    assert parse_cli(TrainConfig, ["--config", str(run / "run_config.yaml")]) == cfg  # comments: --config reads it
    assert json.loads((run / revisions.LOCK_FILE).read_text()) == {REPO: {"revision": "main", "commit": COMMIT}}
    checkpoint = run / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / "config.yaml").write_text(yaml.safe_dump({"reward_model": "videoalign"}))
    card = model_card(checkpoint, export_format="transformer", dtype="fp32", merged_lora=False)
    assert f"## Base weights\n\nDownloaded at these commits" in card and f"- `{REPO}@{COMMIT} (main)`" in card
    unlocked = tmp_path / "other" / "checkpoint-1"
    unlocked.mkdir(parents=True)
    assert "hub commits are not recorded" in model_card(unlocked, export_format="lora", dtype="fp32",
                                                         merged_lora=False)


def test_the_model_card_names_the_released_model_only_for_its_architecture(tmp_path):
    from sage_grpo.models.tiny import TINY_TRANSFORMER_CONFIG

    checkpoint = tmp_path / "run" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump({"pretrained_model_root": "ckpts/tiny",
                                                            "pretrained_transformer_version": "480p_t2v"}))

    def card(base_config, export_format="transformer"):
        text = model_card(checkpoint, export_format=export_format, dtype="fp32", merged_lora=False,
                          base_config=base_config)
        return yaml.safe_load(text.split("---")[1]), text.split("---", 2)[2]

    header, body = card(dict(TINY_TRANSFORMER_CONFIG))
    assert "base_model" not in header
    assert body.startswith("\n\n# A small test transformer of the HunyuanVideo-1.5 class (2 blocks, width 16), fully "
                           "fine-tuned\n\nPost-trained with SAGE-GRPO (sage-grpo) from the checkpoint root "
                           "`ckpts/tiny` (transformer `480p_t2v`), not from the released `tencent/HunyuanVideo-1.5`: "
                           "its transformer has 2 blocks of width 16 where the released one has 54 of width 2048")
    header, body = card({"_class_name": "HunyuanVideo15Transformer3DModel", "num_layers": 54}, "lora")
    assert header["base_model"] == "tencent/HunyuanVideo-1.5"  # the released architecture (the rest: defaults)
    assert body.startswith("\n\n# A LoRA adapter (peft) for the HunyuanVideo-1.5 transformer\n\nPost-trained with "
                           "SAGE-GRPO (sage-grpo) from `tencent/HunyuanVideo-1.5` (transformer `480p_t2v`). Exported "
                           "from `checkpoint-3` (step 3) as `lora` in `fp32`.")
    header, body = card(None)
    assert "base_model" not in header and ("from the checkpoint root `ckpts/tiny` (transformer `480p_t2v`), whose "
                                           "configuration the export did not find: whether it is the released "
                                           "`tencent/HunyuanVideo-1.5` is not known.") in body


def test_the_download_scripts_python_steps_import_neither_torch_nor_diffusers(tmp_path):
    """download_weights.sh runs the lock tool twice per repository and the layout check twice: each paid torch's
    import (over a second) for nothing before (``sage_grpo.models`` imported its loaders eagerly)."""
    lock = tmp_path / revisions.LOCK_FILE
    lock.write_text(json.dumps({REPO: {"revision": "main", "commit": COMMIT}}))
    code = ("import sys, runpy\n"
            f"sys.argv = ['revisions', 'resolve', {REPO!r}, 'main', '--lock', {str(lock)!r}]\n"
            "try:\n    runpy.run_module('sage_grpo.models.revisions', run_name='__main__')\n"
            "except SystemExit as end:\n    assert end.code in (0, None), end.code\n"
            "import sage_grpo.cli.verify\n"
            "print(sorted({'torch', 'diffusers', 'transformers'} & set(sys.modules)))\n")
    result = run_group([sys.executable, "-c", code], timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [COMMIT, "[]"]

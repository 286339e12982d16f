"""The committed toy checkpoint (assets/toy_ckpt, sage_grpo/toy/committed.py) and the checksums checked when a
checkpoint root is loaded (sage_grpo/models/checksums.py): a changed file is refused in one line naming it and the
command that rebuilds it; the committed checkpoint is what scripts/make_toy_checkpoint.py's recorded command builds."""
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch

from sage_grpo.models.checksums import CHECKSUMS_FILE, ChecksumError, verify_checksums, write_checksums
from sage_grpo.toy import committed
from sage_grpo.toy.pretrain import PretrainSettings, toy_recipe

REPO = Path(__file__).resolve().parents[2]


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    return lines[0]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    sys.modules.pop("make_toy_checkpoint", None)
    import make_toy_checkpoint

    yield make_toy_checkpoint
    sys.modules.pop("make_toy_checkpoint", None)


def test_a_changed_file_of_a_checksummed_root_is_refused_at_load(tiny_root, tmp_path):
    """Before: a damaged or edited checkpoint file loaded silently (and trained into different numbers)."""
    from sage_grpo.models.loading import load_components, load_transformer

    root = tmp_path / "model"
    shutil.copytree(tiny_root, root)
    (root / "notes.txt").write_text("any file under the root is listed")
    write_checksums(root, "rebuild it: make-it-again")
    assert verify_checksums(root) is True
    load_components(root, dtype=torch.float32, load_text_encoders=False)  # as recorded: loads
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    _flip_a_byte(weights)
    message = (f"{weights} does not match its sha256 in {root / CHECKSUMS_FILE} (changed or damaged); "
               "rebuild it: make-it-again")
    for load in (lambda: load_components(root, dtype=torch.float32), lambda: load_transformer(root)):
        with pytest.raises(ChecksumError) as err:
            load()
        assert str(err.value) == message
    (root / "notes.txt").unlink()
    with pytest.raises(ChecksumError, match=f"^{root / 'notes.txt'} is missing"):
        load_components(root, dtype=torch.float32)
    assert verify_checksums(tiny_root) is False  # a root without a list loads as before


@pytest.mark.parametrize("entry", [{"../x": "0" * 64}, {"/etc/passwd": "0" * 64}, {"vae/config.json": "abc"}, []])
def test_a_bad_checksum_list_is_refused(tmp_path, entry):
    (tmp_path / CHECKSUMS_FILE).write_text(json.dumps({"rebuild": "r", "files": entry}))
    with pytest.raises(ValueError, match=f"the checksum list {tmp_path / CHECKSUMS_FILE}"):
        verify_checksums(tmp_path)


def test_the_committed_checkpoint_is_what_the_recorded_command_builds(script):
    """The recipe the committed checkpoint was trained with is the builder's today: settings, sizes, constants."""
    record = json.loads((committed.COMMITTED / committed.BUILD_FILE).read_text())
    words = shlex.split(record["command"])
    assert words[:2] == ["python", "scripts/make_toy_checkpoint.py"]
    args = script.build_parser().parse_args(words[2:])
    assert script.settings_of(args) == PretrainSettings() and args.commit_to == "assets/toy_ckpt"
    assert record["recipe"] == toy_recipe(PretrainSettings())
    config = json.loads((committed.COMMITTED / "transformer" / "480p_t2v" / "config.json").read_text())
    assert {k: config[k] for k in record["recipe"]["transformer_config"]} == record["recipe"]["transformer_config"]
    vae = json.loads((committed.COMMITTED / "vae" / "config.json").read_text())
    assert {k: vae[k] for k in record["recipe"]["vae_config"]} == record["recipe"]["vae_config"]
    assert verify_checksums(committed.COMMITTED) is True  # every committed file as recorded
    size = sum(p.stat().st_size for p in committed.COMMITTED.rglob("*") if p.is_file())
    assert size < 10 << 20


def test_the_demo_installs_the_committed_checkpoint_and_refuses_others(script, tmp_path, capsys):
    from sage_grpo.models.loading import load_components

    out = tmp_path / "toy"
    assert script.main(["--committed", "--output", str(out)]) == 0
    transformer = load_components(out, dtype=torch.float32, load_text_encoders=False).transformer
    dead = [p for n, p in transformer.named_parameters() if n.startswith("context_embedder_2.")]
    assert len(dead) == 8 and all(float(p.detach().abs().max()) == 0 for p in dead)
    capsys.readouterr()
    assert script.main(["--committed", "--output", str(out)]) == 0  # again: checked, not rewritten
    assert "every file as recorded" in capsys.readouterr().out
    report = out / "toy_report.json"
    report.write_text(report.read_text() + " ")
    assert script.main(["--committed", "--output", str(out)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: {report} does not match its sha256 in {out / CHECKSUMS_FILE} (changed or damaged); rebuild it: "
        f"python scripts/make_toy_checkpoint.py --committed --output {out} --force")
    assert script.main(["--committed", "--output", str(out), "--force"]) == 0
    (out / CHECKSUMS_FILE).unlink()  # as a checkpoint trained before the checksums were written
    assert script.main(["--committed", "--output", str(out)]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        f"error: {out} holds a toy checkpoint that is not the committed one (trained on this machine, or changed)")


def test_a_changed_committed_file_is_refused_before_anything_is_written(script, tmp_path, capsys, monkeypatch):
    source = tmp_path / "toy_ckpt"
    shutil.copytree(committed.COMMITTED, source)
    monkeypatch.setattr(committed, "COMMITTED", source)
    weights = source / "vae" / "diffusion_pytorch_model.safetensors"
    _flip_a_byte(weights)
    out = tmp_path / "toy"
    assert script.main(["--committed", "--output", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {weights} does not match its sha256 in {source / CHECKSUMS_FILE} (changed or "
                           "damaged); restore it with `git checkout -- assets/toy_ckpt`, or rebuild it: python "
                           "scripts/make_toy_checkpoint.py --output ")
    assert not out.exists() and not any(p.name.endswith(".partial") for p in tmp_path.iterdir())

"""scripts/torch_api_audit.py finds a torch name and a keyword that an older torch's sources lack, and nothing when
the sources are the installed torch's own."""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH_ROOT = Path(torch.__file__).parents[1]
COPIED = ["torch/__init__.py", "torch/distributed/__init__.py", "torch/distributed/_functional_collectives.py",
          "torch/optim/__init__.py", "torch/optim/_muon.py"]
PROJECT_CODE = '''import torch
from torch.distributed import _functional_collectives as funcol


def gather_and_step(x, group, params):
    funcol.all_gather_single_autograd(x, 0, group)
    torch.optim.Muon(params, lr=0.1, nesterov=True)
    return torch.zeros(1)
'''


@pytest.fixture(scope="module")
def audit_script():
    spec = importlib.util.spec_from_file_location("torch_api_audit", REPO_ROOT / "scripts" / "torch_api_audit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torch_sources(root: Path, edits=()) -> Path:
    """A partial copy of the installed torch's sources under ``root``, each (file, old, new) edit applied."""
    for relative in COPIED + [str(p.relative_to(TORCH_ROOT)) for p in (TORCH_ROOT / "torch" / "_C").glob("*.pyi")]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TORCH_ROOT / relative, root / relative)
    for relative, old, new in edits:
        text = (root / relative).read_text()
        assert old in text, f"{old!r} not in {relative}: the fixture no longer matches this torch"
        (root / relative).write_text(text.replace(old, new))
    return root


@pytest.fixture
def project(tmp_path):
    (tmp_path / "project" / "sage_grpo").mkdir(parents=True)
    (tmp_path / "project" / "sage_grpo" / "code.py").write_text(PROJECT_CODE)
    return tmp_path / "project"


def test_reports_a_missing_function_and_keyword(audit_script, project, tmp_path, capsys):
    from torch.distributed import _functional_collectives as funcol

    if not hasattr(funcol, "all_gather_single_autograd"):
        pytest.skip("this torch predates all_gather_single_autograd")
    older = _torch_sources(tmp_path / "older", edits=[
        ("torch/distributed/_functional_collectives.py", "def all_gather_single_autograd(", "def _renamed_gather("),
        ("torch/optim/_muon.py", "nesterov: bool", "nesterov_renamed: bool"),
    ])
    assert audit_script.main([str(older), "--repo", str(project)]) == 1
    missing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MISSING")]
    assert len(missing) == 2, missing
    # the name is still mentioned in the module (a deprecation message), so the definition lookup is what finds it
    assert missing[0] == ("MISSING torch.distributed._functional_collectives.all_gather_single_autograd: "
                          "all_gather_single_autograd is not defined in torch/distributed/_functional_collectives.py")
    code = project / "sage_grpo" / "code.py"
    assert missing[1] == f"MISSING torch.optim.Muon: no keyword 'nesterov' (passed in {code})"


def test_the_same_sources_report_nothing(audit_script, project, tmp_path, capsys):
    same = _torch_sources(tmp_path / "same")
    assert sorted(audit_script.collect_uses(audit_script.project_files(project))) == [
        "torch", "torch.distributed._functional_collectives",
        "torch.distributed._functional_collectives.all_gather_single_autograd", "torch.optim", "torch.optim.Muon",
        "torch.zeros"]
    assert audit_script.main([str(same), "--repo", str(project)]) == 0
    assert "6 torch names used" in capsys.readouterr().out


def test_refuses_a_directory_without_torch_sources(audit_script, tmp_path):
    with pytest.raises(SystemExit, match="holds no torch/__init__.py"):
        audit_script.main([str(tmp_path)])

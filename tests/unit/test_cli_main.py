"""``sage-grpo <verb>``: every verb's --help runs in process and names the verb; unknown verbs and a verb whose module
is not installed fail with one line."""

import runpy
import sys

import pytest

from sage_grpo.cli import main as cli


@pytest.mark.parametrize("verb", sorted(cli.VERBS))
def test_every_verb_has_help(verb, capsys):
    """Every verb's module and function exist (a verb pointing at a moved module is a failure, not a message), and its
    --help names the verb as typed: ``sage-grpo VERB``, or ``python -m sage_grpo VERB`` through the package."""
    module, function, _ = cli.VERBS[verb]
    import importlib

    assert callable(getattr(importlib.import_module(module), function))
    for prog in ("sage-grpo", "python -m sage_grpo"):
        with pytest.raises(SystemExit) as exited:
            cli.main([verb, "--help"], prog=prog)
        assert exited.value.code in (0, None)
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {prog} {verb} ") and "--help" in out


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
@pytest.mark.parametrize("module, args, prog", [
    ("sage_grpo", ["plan", "--help"], "python -m sage_grpo plan"),
    ("sage_grpo", ["--help"], "python -m sage_grpo <verb>"),
    ("sage_grpo.plan", ["--help"], "python -m sage_grpo.plan"),
    ("sage_grpo.evaluate", ["--help"], "python -m sage_grpo.evaluate"),
    ("sage_grpo.cli.verify", ["--help"], "python -m sage_grpo.cli.verify"),
    ("sage_grpo.models.revisions", ["--help"], "python -m sage_grpo.models.revisions"),
])
def test_python_dash_m_names_the_module(module, args, prog, monkeypatch, capsys):
    """``python -m MODULE --help`` (run in process as Python runs it: the module's file in sys.argv[0]) names the
    command ``python -m MODULE``, not ``__main__.py`` or the module's file."""
    monkeypatch.setattr(sys, "argv", ["/somewhere/__main__.py", *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exited.value.code in (0, None)
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_a_verb_error_names_the_verb(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["plan", "--sde_type", "sage"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("sage-grpo plan: error: argument --sde_type: invalid choice: 'sage'")


def test_the_verbs_run_todays_entry_points(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("sage_grpo.cli.export.main", lambda argv: calls.append(argv) or 3)
    assert cli.main(["export", "--checkpoint", "x"]) == 3 and calls == [["--checkpoint", "x"]]
    assert cli.VERBS["train"][:2] == ("sage_grpo.cli.train", "main")  # what sage-grpo-train runs
    assert cli.main([]) == 2 and "verbs:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0 and "  serve-reward  serve a reward over HTTP" in capsys.readouterr().out
    assert cli.main(["trian"]) == 2 and "unknown verb 'trian'" in capsys.readouterr().err


def test_verify_checks_a_model_root(tiny_root, tmp_path, capsys):
    """``sage-grpo verify`` runs the layout check: exit 0 and ``complete`` on the tiny root, exit 1 naming what is
    missing on a root without its VAE weights."""
    assert cli.main(["verify", "--model_root", str(tiny_root)]) == 0
    assert capsys.readouterr().out == f"{tiny_root}: complete (480p_t2v)\n"
    broken = tmp_path / "broken"
    (broken / "vae").mkdir(parents=True)
    assert cli.main(["verify", "--model_root", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "vae/diffusion_pytorch_model.safetensors" in err and "transformer/480p_t2v" in err


def test_a_missing_module_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(cli.VERBS, "evaluate", ("sage_grpo.no_such_module", "main", "x"))
    assert cli.main(["evaluate", "--checkpoint", "x"]) == 2
    assert capsys.readouterr().err == ("error: sage-grpo evaluate: sage_grpo.no_such_module is not installed in this "
                                       "version of sage-grpo\n")

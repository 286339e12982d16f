"""``sage-grpo <verb>``: every verb's --help runs in process and names the verb; unknown verbs and a verb whose module
is not installed fail with one line."""

import pytest

from sage_grpo.cli import main as cli


@pytest.mark.parametrize("verb", sorted(cli.VERBS))
def test_every_verb_has_help(verb, capsys):
    """Every verb's module and function exist (a verb pointing at a moved module is a failure, not a message)."""
    module, function, _ = cli.VERBS[verb]
    import importlib

    assert function is None or callable(getattr(importlib.import_module(module), function))
    with pytest.raises(SystemExit) as exited:
        cli.main([verb, "--help"])
    assert exited.value.code in (0, None)
    out = capsys.readouterr().out
    prog = "python -m sage_grpo.plan" if verb == "plan" else f"sage-grpo {verb}"  # the planner names itself
    assert out.startswith(f"usage: {prog} ") and "--help" in out


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

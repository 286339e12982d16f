"""pyproject.toml: the wheel holds the whole sage_grpo package and nothing else, its console commands point at
functions inside the package that answer --help, and its dependencies are requirements.txt (pytest only as an extra)."""

import configparser
import importlib
import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from procs import run_group

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {  # pyproject.toml [project.scripts]
    "sage-grpo": "sage_grpo.cli.main:main",
    "sage-grpo-train": "sage_grpo.cli.train:main",
    "sage-grpo-generate": "sage_grpo.cli.generate:main",
    "sage-grpo-export": "sage_grpo.cli.export:main",
    "sage-grpo-verify-weights": "sage_grpo.cli.verify:main",
    "sage-grpo-convert-reference": "sage_grpo.cli.convert:main",
    "sage-grpo-evaluate": "sage_grpo.evaluate:main",
}
BUILD_INPUTS = ("pyproject.toml", "README.md", "requirements.txt", "requirements-dev.txt")


def _requirements(name):
    lines = (REPO_ROOT / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built offline from a copy of the files the build reads (the checkout stays free of build/ and egg-info)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy(REPO_ROOT / name, source / name)
    shutil.copytree(REPO_ROOT / "sage_grpo", source / "sage_grpo", ignore=shutil.ignore_patterns("__pycache__"))
    result = run_group([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", str(base / "dist"), str(source)], cwd=base, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = (base / "dist").glob("sage_grpo-*.whl")
    return zipfile.ZipFile(built)


def _dist_info(wheel, name):
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def test_wheel_holds_every_module_and_no_tests(wheel):
    names = set(wheel.namelist())
    modules = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "sage_grpo").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in names if n.endswith(".py")} == modules
    for subpackage in ("sage_grpo/cli/", "sage_grpo/models/", "sage_grpo/distributed/", "sage_grpo/toy/"):
        assert f"{subpackage}__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "configs/", "assets/"))]


def test_wheel_entry_points_are_the_console_commands(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(entry_points["console_scripts"]) == COMMANDS


def test_wheel_requires_requirements_txt_and_pytest_only_as_an_extra(wheel):
    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    requires = metadata.get_all("Requires-Dist")
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime == _requirements("requirements.txt")
    assert not any(r.lower().startswith("pytest") for r in runtime)
    test_extra = [r.split(";")[0].strip() for r in requires if 'extra == "test"' in r]
    assert test_extra == _requirements("requirements-dev.txt")
    assert set(metadata.get_all("Provides-Extra")) == {"wandb", "swanlab", "trackers", "test", "dev"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_console_command_functions_answer_help(command, capsys):
    module, function = COMMANDS[command].split(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_root_scripts_are_wrappers_of_the_package_functions():
    import generate
    import post_train

    from sage_grpo.cli import generate as generate_cli
    from sage_grpo.cli import train as train_cli

    assert post_train.main is train_cli.main and generate.main is generate_cli.main
    for script, target in (("export_checkpoint.py", "sage_grpo.cli.export"),
                           ("convert_reference_checkpoint.py", "sage_grpo.cli.convert"),
                           ("evaluate.py", "sage_grpo.evaluate"),
                           ("reward_server.py", "sage_grpo.cli.serve_reward"), ("plot_run.py", "sage_grpo.cli.plot"),
                           ("make_tiny_checkpoint.py", "sage_grpo.cli.make_tiny")):
        text = (REPO_ROOT / "scripts" / script).read_text()
        assert f"from {target} import main" in text, script

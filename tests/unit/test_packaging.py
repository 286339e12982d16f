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
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "requirements.txt", "requirements-dev.txt")


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


def test_wheel_carries_the_version_and_the_apache_license(wheel):
    import sage_grpo

    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    assert metadata["Version"] == sage_grpo.__version__ == "0.2.0"
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]  # PEP 639: the SPDX line
    assert _dist_info(wheel, "licenses/LICENSE") == (REPO_ROOT / "LICENSE").read_text()


def test_license_is_the_apache_text_with_our_copyright_line():
    """LICENSE: the copyright line, then the Apache License 2.0 exactly as apache.org publishes it (its MD5)."""
    import hashlib

    first, rest = (REPO_ROOT / "LICENSE").read_bytes().split(b"\n", 1)
    assert first == b"Copyright 2026 the sage-grpo authors"
    assert hashlib.md5(rest).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"


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


STUB_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls"
if [[ " $* " == *" -e . "* ]]; then touch "$(dirname "$0")/sage-grpo"; chmod +x "$(dirname "$0")/sage-grpo"; fi
"""


def _setup_env(checkout, venv):
    """scripts/setup_env.sh of ``checkout`` on ``venv``, whose python records its arguments: the pip calls made."""
    calls = venv / "calls"
    calls.unlink(missing_ok=True)
    result = run_group(["bash", str(checkout / "scripts" / "setup_env.sh")], timeout=60,
                       env={"PATH": "/usr/bin:/bin", "SAGE_VENV": str(venv)})
    assert result.returncode == 0, result.stderr
    return [line.removeprefix("-m pip install -q ") for line in calls.read_text().splitlines()] \
        if calls.exists() else []


def test_setup_env_installs_the_checkout_editable_once(tmp_path):
    """The quickstart's setup installs the requirements, then this checkout editable without dependencies, build
    isolation or a package index (offline: nothing downloaded); a second run does nothing; a changed pyproject.toml
    or a moved checkout installs the package again, and only it."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("scripts/setup_env.sh", "pyproject.toml", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(REPO_ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(STUB_PYTHON)
    (venv / "bin" / "python").chmod(0o755)
    editable = "--no-deps --no-build-isolation --no-index -e ."
    assert _setup_env(checkout, venv) == ["--upgrade pip setuptools>=77", "torch==2.13.0", "-r requirements.txt",
                                          editable]
    assert _setup_env(checkout, venv) == []
    with open(checkout / "pyproject.toml", "a") as handle:
        handle.write("# a new console command, say\n")
    assert _setup_env(checkout, venv) == [editable]
    moved = tmp_path / "moved"
    shutil.copytree(checkout, moved)
    assert _setup_env(moved, venv) == [editable] and _setup_env(moved, venv) == []


def test_setup_env_wants_the_setuptools_pyproject_builds_with():
    import tomllib

    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert f'SETUPTOOLS_SPEC="{requires[0]}"' in (REPO_ROOT / "scripts" / "setup_env.sh").read_text()
    assert requires == ["setuptools>=77"] and "setuptools>=77" in _requirements("requirements-dev.txt")

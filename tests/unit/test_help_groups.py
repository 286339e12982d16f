"""``--help`` shows every command's flags in topic groups (sage_grpo/config/help_groups.py), each flag in exactly one:
a flag added without a group fails here with a message naming where to declare it."""

import argparse
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Dict, List

import pytest

from sage_grpo.cli.main import VERBS
from sage_grpo.cli.main import main as sage_grpo_main
from sage_grpo.config import help_groups
from sage_grpo.config.help_groups import FLAG_GROUPS, TRAIN_GROUPS, UNGROUPED, class_key
from sage_grpo.config.schema import build_parser, config_field
from sage_grpo.config.train import TrainConfig

PACKAGE = Path(__file__).resolve().parents[2] / "sage_grpo"
GROUPS_FILE = "sage_grpo/config/help_groups.py"


def config_class(key: str) -> type:
    module, _, name = key.rpartition(".")
    return getattr(importlib.import_module(module), name)


def table_name(table) -> str:
    return next((name for name, value in vars(help_groups).items() if value is table), "its table")


def group_problems(cls: type) -> List[str]:
    """What is wrong with ``cls``'s groups: a field in no group or in two, a group naming no field, an empty group."""
    table = FLAG_GROUPS[class_key(cls)]
    where = f"{table_name(table)} in {GROUPS_FILE}"
    fields = [field.name for field in dataclasses.fields(cls)]
    placed: Dict[str, List[str]] = {}
    problems = []
    for title, _, names in table:
        if not names:
            problems.append(f"group {title!r} of {where} is empty")
        for name in names:
            placed.setdefault(name, []).append(title)
    for name in fields:
        if name not in placed:
            problems.append(f"{cls.__name__}.{name} (--{name}) has no --help group: add {name!r} to one of the groups "
                            f"of {where}")
        elif len(placed[name]) > 1:
            problems.append(f"--{name} is in several groups of {where}: {placed[name]}; keep one")
    problems += [f"{where} names {name!r}, which is not a field of {cls.__name__}: remove or rename it"
                 for name in placed if name not in fields]
    return problems


def help_sections(help_text: str) -> Dict[str, str]:
    """``--flag`` -> the title of the ``--help`` section it is listed under."""
    sections, title = {}, None
    for line in help_text.splitlines():
        heading = re.fullmatch(r"(\S.*):", line)
        if heading:
            title = heading.group(1)
        option = re.match(r"  (--\w+)", line)
        if option and title is not None:
            sections[option.group(1)] = title
    return sections


@pytest.mark.parametrize("key", sorted(FLAG_GROUPS))
def test_every_flag_has_exactly_one_group_and_help_shows_it_there(key):
    cls = config_class(key)
    assert group_problems(cls) == []
    shown = help_sections(build_parser(cls).format_help())
    expected = {f"--{name}": title for title, _, names in FLAG_GROUPS[key] for name in names}
    assert {flag: shown[flag] for flag in expected} == expected
    assert UNGROUPED not in shown.values()


def test_every_config_class_has_a_group_table():
    """Every dataclass of config_field options in sage_grpo/ (a command's flags) has its table."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        if "config_field(" in path.read_text() and path.name != "schema.py":
            module = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
            found.update(class_key(value) for value in vars(module).values()
                         if dataclasses.is_dataclass(value) and isinstance(value, type)
                         and value.__module__ == module.__name__
                         and any("help" in field.metadata for field in dataclasses.fields(value)))
    missing = sorted(found - set(FLAG_GROUPS))
    assert not missing, f"config classes without --help groups: {missing}; add a table to {GROUPS_FILE}"
    assert set(FLAG_GROUPS) <= found


def test_post_train_and_plan_help_list_their_flags_by_topic(capsys):
    from sage_grpo.cli.train import main as train_main
    from sage_grpo.plan.report import main as plan_main

    for main in (train_main, plan_main):
        with pytest.raises(SystemExit) as done:
            main(["--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage: ") and len(text.split("\n", 1)[0]) < 80  # no 120-line usage block
        titles = [title for title, _, _ in TRAIN_GROUPS]
        assert [t for t in re.findall(r"^(\S[^\n]*):$", text, re.M) if t in titles] == titles  # in table order
        shown = help_sections(text)
        assert shown["--sde_type"] == "rollout and SDE" and shown["--kl_weight"] == "KL and trust region"
        assert shown["--use_moving_KL"] == "KL and trust region" and shown["--sp_size"] == "parallelism and memory"


def test_a_new_flag_without_a_group_fails_naming_where_to_declare_it(monkeypatch):
    """The rule on a deliberately broken config: a branch adds --example_new_flag and forgets its group."""

    @dataclasses.dataclass
    class WithNewFlag(TrainConfig):
        example_new_flag: float = config_field(0.0, "a flag some branch adds")

    monkeypatch.setitem(FLAG_GROUPS, class_key(WithNewFlag), TRAIN_GROUPS)
    assert group_problems(WithNewFlag) == [
        "WithNewFlag.example_new_flag (--example_new_flag) has no --help group: add 'example_new_flag' to one of the "
        "groups of TRAIN_GROUPS in sage_grpo/config/help_groups.py"]
    shown = help_sections(build_parser(WithNewFlag).format_help())
    assert shown["--example_new_flag"] == UNGROUPED and shown["--kl_weight"] == "KL and trust region"  # it still works
    stale = (("KL and trust region", "", ("kl_weight", "kl_weight_typo")),)
    monkeypatch.setitem(FLAG_GROUPS, class_key(WithNewFlag), stale)
    assert f"its table in {GROUPS_FILE} names 'kl_weight_typo', which is not a field of WithNewFlag: remove or " \
        "rename it" in group_problems(WithNewFlag)


@pytest.mark.parametrize("key", sorted(FLAG_GROUPS))
def test_every_flag_with_choices_lists_them_in_help(key):
    """``--sde_type {sage_grpo,dance_grpo,flow_grpo,cps}``, not ``--sde_type SDE_TYPE``: the valid values of every
    option declared with choices are in --help."""
    cls = config_class(key)
    text = " ".join(build_parser(cls).format_help().split())
    with_choices = [field for field in dataclasses.fields(cls) if field.metadata.get("choices")]
    for field in with_choices:
        assert f"--{field.name} {{{','.join(map(str, field.metadata['choices']))}}}" in text, field.name


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_command_lists_the_choices_of_its_flags(verb, monkeypatch, capsys):
    """Every command's parser, the plain argparse ones included (export, convert, make-tiny): each option with
    choices shows them in --help."""
    shown = []
    print_help = argparse.ArgumentParser.print_help
    monkeypatch.setattr(argparse.ArgumentParser, "print_help",
                        lambda self, file=None: shown.append(self) or print_help(self, file))
    with pytest.raises(SystemExit):
        sage_grpo_main([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    (parser,) = shown
    for action in [action for action in parser._actions if action.choices and action.option_strings]:
        assert f"{action.option_strings[0]} {{{','.join(map(str, action.choices))}}}" in text, action.dest
    if verb == "train":
        assert "--sde_type {sage_grpo,dance_grpo,flow_grpo,cps}" in text
        assert len([action for action in parser._actions if action.choices]) >= 20

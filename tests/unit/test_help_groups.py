"""``--help`` shows every command's flags in topic groups, read from the options' own declarations: a section of a
sectioned configuration (``TrainConfig``), or the ``group`` a flat configuration's option names. An option without a
group, or declared by two sections, fails with a message naming where to declare it."""

import argparse
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Dict, Optional

import pytest

from sage_grpo.cli.main import VERBS
from sage_grpo.cli.main import main as sage_grpo_main
from sage_grpo.config import sections
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.reward_server import RewardServerConfig
from sage_grpo.config.schema import build_parser, config_field
from sage_grpo.config.sections import help_groups, names_where, section
from sage_grpo.config.train import RUN_DEFINING, TrainConfig
from sage_grpo.evaluate.config import EvaluateConfig

PACKAGE = Path(__file__).resolve().parents[2] / "sage_grpo"
COMMAND_CONFIGS = (TrainConfig, GenerateConfig, EvaluateConfig, RewardServerConfig)


def help_sections(help_text: str) -> Dict[str, str]:
    """``--flag`` -> the title of the ``--help`` section it is listed under."""
    found, title = {}, None
    for line in help_text.splitlines():
        heading = re.fullmatch(r"(\S.*):", line)
        if heading:
            title = heading.group(1)
        option = re.match(r"  (--\w+)", line)
        if option and title is not None:
            found[option.group(1)] = title
    return found


@pytest.mark.parametrize("cls", COMMAND_CONFIGS, ids=lambda cls: cls.__name__)
def test_every_flag_is_shown_under_its_own_group(cls):
    groups = help_groups(cls)
    assert all(title and fields for title, _, fields in groups)  # titled, none empty
    expected = {f"--{field.name}": title for title, _, fields in groups for field in fields}
    assert len(expected) == len(sections.option_fields(cls))  # every option in exactly one group
    shown = help_sections(build_parser(cls).format_help())
    assert {flag: shown[flag] for flag in expected} == expected


def test_every_config_class_groups_its_flags():
    """Every dataclass of config_field options in sage_grpo/ (a command's flags, or a section of them) is a section,
    a sectioned configuration or a flat one with HELP_GROUPS."""
    ungrouped = []
    for path in PACKAGE.rglob("*.py"):
        if "config_field(" not in path.read_text() or path.name == "schema.py":
            continue
        module = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for value in vars(module).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
                    and any("help" in field.metadata for field in dataclasses.fields(value))
                    and not sections.is_section(value) and not sections.section_fields(value)
                    and not hasattr(value, sections.HELP_GROUPS_ATTR)):
                ungrouped.append(value.__name__)
    assert ungrouped == []


def test_post_train_and_plan_help_list_their_flags_by_section(capsys):
    from sage_grpo.cli.train import main as train_main
    from sage_grpo.plan.report import main as plan_main

    titles = [title for title, _, _ in help_groups(TrainConfig)]
    assert titles[:3] == ["model", "data", "rollout and SDE"] and len(titles) == 14
    for main in (train_main, plan_main):
        with pytest.raises(SystemExit) as done:
            main(["--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage: ") and len(text.split("\n", 1)[0]) < 80  # no 120-line usage block
        assert [t for t in re.findall(r"^(\S[^\n]*):$", text, re.M) if t in titles] == titles  # in section order
        shown = help_sections(text)
        assert shown["--sde_type"] == "rollout and SDE" and shown["--kl_weight"] == "KL and trust region"
        assert shown["--use_moving_KL"] == "KL and trust region" and shown["--sp_size"] == "parallelism and memory"


def test_a_flat_option_without_a_group_fails_naming_the_table():
    @dataclasses.dataclass
    class Flat:
        HELP_GROUPS = (("speed", "how fast"),)
        steps: int = config_field(4, "steps", group="speed")
        new_flag: float = config_field(0.0, "a flag some branch adds")

    with pytest.raises(TypeError, match=r"Flat: options \['new_flag'\] name no group of its HELP_GROUPS \['speed'\]"):
        build_parser(Flat)


def test_an_option_two_sections_declare_is_refused():
    @section("a", "first")
    @dataclasses.dataclass
    class First:
        rate: float = config_field(1.0, "a rate")

    @section("b", "second")
    @dataclasses.dataclass
    class Second:
        rate: float = config_field(2.0, "another rate")

    @dataclasses.dataclass
    class Both:
        first: First = dataclasses.field(default_factory=First)
        second: Second = dataclasses.field(default_factory=Second)

    with pytest.raises(TypeError, match="option 'rate' is declared by both the first and the second section"):
        sections.option_fields(Both)


def test_what_an_option_is_comes_from_its_declaration():
    """The run-defining options (resume refuses their change) and the card's are the options declared so."""

    @section("s", "a section")
    @dataclasses.dataclass
    class Part:
        kept: int = config_field(1, "defines the run", defines_run=True, on_card=True)
        free: int = config_field(2, "may change on resume")

    @dataclasses.dataclass
    class Whole:
        part: Part = dataclasses.field(default_factory=Part)

    assert names_where(Whole, "defines_run") == ("kept",) and names_where(Whole, "on_card") == ("kept",)
    assert "sde_type" in RUN_DEFINING and "max_steps" not in RUN_DEFINING and "output_dir" not in RUN_DEFINING


def owner(name: str) -> Optional[str]:
    return sections.owners(TrainConfig).get(name)


def test_flat_names_route_to_sections():
    cfg = TrainConfig.of(sde_type="cps", kl_weight=0.0)
    assert cfg.rollout.sde_type == "cps" and cfg.trust_region.kl_weight == 0.0
    assert owner("sde_type") == "rollout" and owner("output_dir") == "output"
    moved = cfg.replace(eta=0.3, learning_rate=2e-5)
    assert (moved.rollout.eta, moved.optim.learning_rate, moved.rollout.sde_type) == (0.3, 2e-5, "cps")
    assert cfg.rollout.eta == 0.5  # the original is unchanged


@pytest.mark.parametrize("cls", COMMAND_CONFIGS, ids=lambda cls: cls.__name__)
def test_every_flag_with_choices_lists_them_in_help(cls):
    """``--sde_type {sage_grpo,dance_grpo,flow_grpo,cps}``, not ``--sde_type SDE_TYPE``: the valid values of every
    option declared with choices are in --help."""
    text = " ".join(build_parser(cls).format_help().split())
    with_choices = [field for _, field in sections.option_fields(cls) if field.metadata.get("choices")]
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

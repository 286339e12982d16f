"""Sections: a command's options grouped by what they configure, each option declared once.

A *section* is a dataclass of options (:func:`~sage_grpo.config.schema.config_field`) marked with
``@section(title, about)``: the title and description of its ``--help`` group. A *sectioned* configuration
(``TrainConfig``) is a dataclass whose fields are sections; its options stay flat on the command line and in YAML
files (every flag keeps the reference's name: ``--sde_type``, not ``--rollout.sde_type``) and are routed to their
section by name, so option names are unique across a configuration's sections. A *flat* configuration
(``GenerateConfig``) names each option's help group in the field's metadata (``config_field(..., group=...)``) and
lists its groups' titles and descriptions once, in a class attribute ``HELP_GROUPS``.

What an option is besides its value lives in its field's metadata, read here and nowhere else by name: its help
group, whether it defines the run (a resume refuses to change it: ``defines_run``), whether an exported model's card
records it (``on_card``).
"""

import dataclasses
import functools
import typing
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Tuple

SECTION_ATTR = "__section__"  # (title, description) of a section class's --help group
HELP_GROUPS_ATTR = "HELP_GROUPS"  # a flat configuration's ((title, description), ...) in --help order
EXPLICIT_ATTR = "_explicit_fields"  # set on instances by from_dict; not a dataclass field (asdict, == ignore it)
CONFIG_FILE_ATTR = "_config_file"  # likewise, by parse_cli: the --config file the values came from


def section(title: str, about: str):
    """Class decorator: the dataclass is one section of a configuration, shown in ``--help`` as the group
    ``title`` with the description ``about``."""

    def mark(cls):
        setattr(cls, SECTION_ATTR, (title, about))
        return cls

    return mark


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and hasattr(tp, SECTION_ATTR)


@functools.lru_cache(maxsize=None)
def section_fields(cls: type) -> Tuple[Tuple[str, type], ...]:
    """``((attribute, section class), ...)`` of a sectioned configuration, in declaration order; ``()`` for a flat
    one (or a section itself)."""
    hints = typing.get_type_hints(cls)
    found = tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls)
                  if is_section(hints[field.name]))
    if found and len(found) != len(dataclasses.fields(cls)):
        raise TypeError(f"{cls.__name__}: a sectioned configuration holds sections only")
    return found


@functools.lru_cache(maxsize=None)
def option_fields(cls: type) -> Tuple[Tuple[Optional[str], dataclasses.Field], ...]:
    """``((section attribute or None, field), ...)`` of every option of ``cls``, sections in order. Raises on an
    option name two sections declare (the flags are flat)."""
    sections = section_fields(cls)
    if not sections:
        return tuple((None, field) for field in dataclasses.fields(cls))
    options, seen = [], {}
    for attr, section_cls in sections:
        for field in dataclasses.fields(section_cls):
            if field.name in seen:
                raise TypeError(f"{cls.__name__}: option {field.name!r} is declared by both the {seen[field.name]} "
                                f"and the {attr} section")
            seen[field.name] = attr
            options.append((attr, field))
    return tuple(options)


@functools.lru_cache(maxsize=None)
def fields_by_name(cls: type) -> Dict[str, dataclasses.Field]:
    """Option name -> its field, over every section."""
    return {field.name: field for _, field in option_fields(cls)}


@functools.lru_cache(maxsize=None)
def owners(cls: type) -> Dict[str, Optional[str]]:
    """Option name -> the attribute of the section that declares it (None in a flat configuration)."""
    return {field.name: attr for attr, field in option_fields(cls)}


def names_where(cls: type, key: str) -> Tuple[str, ...]:
    """The options whose field metadata sets ``key`` (``defines_run``, ``on_card``, ...), in declaration order."""
    return tuple(field.name for _, field in option_fields(cls) if field.metadata.get(key))


def help_groups(cls: type) -> List[Tuple[Optional[str], Optional[str], List[dataclasses.Field]]]:
    """``cls``'s options as ``(title, description, fields)`` in ``--help`` order: one group per section, or per
    ``HELP_GROUPS`` entry of a flat configuration (its fields by their ``group`` metadata). A class with neither:
    one untitled group of every option."""
    sections = section_fields(cls)
    if sections:
        return [(*getattr(section_cls, SECTION_ATTR), list(dataclasses.fields(section_cls)))
                for _, section_cls in sections]
    fields = list(dataclasses.fields(cls))
    groups = getattr(cls, HELP_GROUPS_ATTR, None)
    if groups is None:
        return [(None, None, fields)]
    titles = [title for title, _ in groups]
    stray = [field.name for field in fields if field.metadata.get("group") not in titles]
    if stray:
        raise TypeError(f"{cls.__name__}: options {stray} name no group of its {HELP_GROUPS_ATTR} {titles}")
    return [(title, about, [field for field in fields if field.metadata["group"] == title])
            for title, about in groups]


def default_of(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def build(cls: type, values: Dict[str, Any], explicit: Optional[FrozenSet[str]] = None) -> Any:
    """An instance of ``cls`` from flat ``{option: value}`` (values already typed), each routed to its section;
    ``explicit`` (the options a file or the command line chose) is recorded on the instance and its sections."""
    owner = owners(cls)
    unknown = sorted(set(values) - set(owner))
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {unknown[0]!r}")
    sections = section_fields(cls)
    if sections:
        parts = {attr: section_cls(**{name: value for name, value in values.items() if owner[name] == attr})
                 for attr, section_cls in sections}
        config = cls(**parts)
    else:
        config = cls(**values)
    if explicit is not None:
        mark_explicit(config, explicit)
    return config


def mark_explicit(config: Any, explicit: FrozenSet[str]) -> None:
    object.__setattr__(config, EXPLICIT_ATTR, frozenset(explicit))
    for attr, section_cls in section_fields(type(config)):
        mine = frozenset(field.name for field in dataclasses.fields(section_cls))
        object.__setattr__(getattr(config, attr), EXPLICIT_ATTR, frozenset(explicit) & mine)


def flat_items(config: Any) -> Iterator[Tuple[str, Any]]:
    """``(option, value)`` of every option, in declaration order (a sectioned configuration's sections flattened)."""
    for attr, field in option_fields(type(config)):
        holder = config if attr is None else getattr(config, attr)
        yield field.name, getattr(holder, field.name)


def value_of(config: Any, name: str) -> Any:
    """The value of option ``name`` (a flat name, as a flag names it), in whichever section holds it."""
    attr = owners(type(config))[name]
    return getattr(config if attr is None else getattr(config, attr), name)


def with_values(config: Any, **values: Any) -> Any:
    """A copy of ``config`` with ``values`` (flat option names) replaced in their sections; the record of chosen
    options and the ``--config`` file the values came from are kept as they were (see
    :func:`~sage_grpo.config.schema.replace_chosen` to count the new values as chosen)."""
    cls = type(config)
    owner = owners(cls)
    unknown = sorted(set(values) - set(owner))
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {unknown[0]!r}")
    if section_fields(cls):
        changes = {}
        for attr in {owner[name] for name in values}:
            changes[attr] = dataclasses.replace(getattr(config, attr),
                                                **{k: v for k, v in values.items() if owner[k] == attr})
        updated = dataclasses.replace(config, **changes)
    else:
        updated = dataclasses.replace(config, **values)
    recorded = getattr(config, EXPLICIT_ATTR, None)
    if recorded is not None:
        mark_explicit(updated, recorded)
    if getattr(config, CONFIG_FILE_ATTR, None) is not None:
        object.__setattr__(updated, CONFIG_FILE_ATTR, getattr(config, CONFIG_FILE_ATTR))
    return updated

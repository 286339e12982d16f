"""Dataclass-driven configuration: one schema gives the CLI flags, the YAML keys and the defaults.

A config class is a plain ``@dataclass`` whose fields are declared with :func:`config_field`. From it,
:func:`parse_cli` builds an ``argparse`` parser with one flag per field, named exactly as the field (so the reference's
launch lines such as ``--sde_type sage_grpo --kl_weight 1e-5`` work unchanged). Values are resolved in three layers:
field default < ``--config file.yaml`` < command-line flags. Unknown YAML keys are errors.

Booleans parse like the reference's ``str_to_bool`` with ``nargs='?'`` and ``const=True``: a bare ``--flag`` means True,
and true/false/1/0/yes/no/on/off (any case) are accepted. A mapping option takes a YAML mapping, its JSON text, or
``key=value`` / ``key`` words (a YAML list, several words on the command line).

A config built from values (:func:`from_dict`, hence :func:`parse_cli`) records which fields the YAML file or the
command line set; :func:`is_explicit` asks it. Settings whose default depends on the model (the guidance of a
cfg-distilled variant) use it to tell a user's choice from a default.
"""

import argparse
import copy
import dataclasses
import datetime
import difflib
import json
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Type, TypeVar

import yaml

from sage_grpo.config import sections
from sage_grpo.config.sections import CONFIG_FILE_ATTR as _CONFIG_FILE_ATTR
from sage_grpo.config.sections import EXPLICIT_ATTR as _EXPLICIT_ATTR
from sage_grpo.config.sections import default_of as _default_of
from sage_grpo.config.text import MAX_ECHO_CHARS, shorten  # noqa: F401 (re-exported: the messages' one formatter)
from sage_grpo.config.yaml_file import load_yaml  # noqa: F401 (re-exported: the one YAML reader)

T = TypeVar("T")
_SCALARS = (str, int, float, bool, datetime.date)  # YAML reads 2026-11-25 as a date (run_name: 2026-11-25)
_TRUE = {"true", "1", "yes", "on", "y", "t"}
_FALSE = {"false", "0", "no", "off", "n", "f"}


def str_to_bool(value: Any) -> bool:
    """Parse a boolean the way the reference does (case-insensitive true/1/yes/on, false/0/no/off)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no, on/off), got {shorten(value)}")


def config_field(
    default: Any,
    help: str,
    *,
    choices: Optional[Sequence[Any]] = None,
    nargs: Optional[str] = None,
    aliases: Sequence[str] = (),
    no_effect: Optional[str] = None,
    defines_run: bool = False,
    on_card: bool = False,
    group: Optional[str] = None,
    bound: Any = None,
) -> Any:
    """Declare a config field, with what it is besides its value (read by :mod:`sage_grpo.config.sections`).

    ``no_effect``: for flags the reference accepts but ignores, the reason; setting such a flag emits a warning.
    ``aliases``: extra command-line spellings (``--video_length`` for ``--validate_video_length``).
    ``defines_run``: a resume refuses to change it (the continued run would be another experiment).
    ``on_card``: an exported model's card records it. ``group``: the ``--help`` group of an option of a flat
    configuration (a sectioned one's group is its section). ``bound``: a number's range
    (:class:`~sage_grpo.config.bounds.Bound`), or why it has none of its own (every numeric option declares one).
    """
    metadata = {"help": help, "choices": choices, "nargs": nargs, "aliases": tuple(aliases), "no_effect": no_effect,
                "defines_run": defines_run, "on_card": on_card, "group": group, "bound": bound}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _scalar_converter(tp: Any):
    if tp is bool:
        return str_to_bool
    if tp in (int, float, str):
        def convert(value: Any, _tp=tp) -> Any:
            if _tp is int and isinstance(value, float) and not value.is_integer():
                raise argparse.ArgumentTypeError(f"expected an integer, got {shorten(value)}")
            if _tp is int and isinstance(value, str):
                if "e" not in value.lower():
                    return int(value)
                number = float(value)  # 1e4 is an integer; 2.5e0 is not
                if not number.is_integer():
                    raise argparse.ArgumentTypeError(f"expected an integer, got {shorten(value)}")
                return int(number)
            return _tp(value)
        return convert
    if _is_mapping(tp):
        return _mapping
    raise TypeError(f"unsupported config field type {tp!r}")


def _is_mapping(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def _mapping(value: Any) -> dict:
    """A mapping option's value: a mapping, its JSON text, or ``key=value`` / ``key`` words (a YAML list, several words
    on the command line), a value read as JSON when it parses (numbers, booleans) and as text otherwise, a bare key
    mapping to None."""
    if isinstance(value, dict):
        return value
    words = [word for word in ([value] if isinstance(value, str) else value) if str(word).strip()]
    if len(words) == 1 and str(words[0]).lstrip().startswith("{"):
        return json.loads(words[0])
    mapping: Dict[str, Any] = {}
    for word in words:
        key, sep, text = str(word).partition("=")
        try:
            mapping[key.strip()] = json.loads(text) if sep else None
        except json.JSONDecodeError:
            mapping[key.strip()] = text
    return mapping


def _converter(field: dataclasses.Field):
    """Return (convert_one_value, is_list, is_optional) for a field."""
    tp, optional = _unwrap_optional(field.type)
    if typing.get_origin(tp) in (list, List):
        (inner,) = typing.get_args(tp)
        return _scalar_converter(inner), True, optional
    return _scalar_converter(tp), False, optional


def _check_shape(field: dataclasses.Field, value: Any, is_list: bool) -> None:
    """A scalar option takes one number, string or boolean and a list option a list of them: a list (or mapping) is
    never turned into its text (a YAML alias bomb would expand into gigabytes)."""
    tp, _ = _unwrap_optional(field.type)
    if _is_mapping(tp):
        words = isinstance(value, (list, tuple)) and all(isinstance(item, _SCALARS) for item in value)
        if not (isinstance(value, (dict, str)) or words):
            raise ValueError(f"{field.name}: expected a mapping, its JSON text or key=value words, got a "
                             f"{type(value).__name__}: {shorten(value)}")
        return
    items = value if is_list and isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not isinstance(item, _SCALARS):
            kind = "a list of values" if is_list else "one value"
            raise ValueError(f"{field.name}: expected {kind} (a string, number or boolean), got a "
                             f"{type(item).__name__}: {shorten(item)}" + (" (give a JSON option as a quoted string)"
                                                                           if tp is str else ""))


def coerce_value(field: dataclasses.Field, value: Any) -> Any:
    """Convert a YAML/CLI value to the field's type; ``None`` is kept for Optional fields. Errors echo the value
    cut to :data:`MAX_ECHO_CHARS`."""
    convert, is_list, optional = _converter(field)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("none", "null")):
        if optional:
            return None
        raise ValueError(f"{field.name}: a value is required (got None)")
    _check_shape(field, value, is_list)
    try:
        if is_list:
            items = value if isinstance(value, (list, tuple)) else [value]
            result = [convert(v) for v in items]
        else:
            result = convert(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{field.name}: cannot use {shorten(value)}: {shorten(str(err), quote=False)}") from None
    choices = field.metadata.get("choices")
    if choices is not None:
        for item in result if is_list else [result]:
            if item not in choices:
                raise ValueError(f"{field.name}: {shorten(item)} is not one of {list(choices)}")
    return result


def _add_flag(parser: Any, field: dataclasses.Field) -> None:
    convert, is_list, _ = _converter(field)
    meta = field.metadata
    names = [f"--{field.name}"] + [f"--{a}" for a in meta.get("aliases", ())]
    default = _default_of(field)
    help_text = f"{meta.get('help', '')} (default: {default!r})"
    if meta.get("no_effect"):
        help_text += f" [accepted for compatibility; no effect: {meta['no_effect']}]"
    kwargs: Dict[str, Any] = dict(dest=field.name, default=argparse.SUPPRESS, help=help_text)
    choices = None if meta.get("choices") is None else [str(c) for c in meta["choices"]]
    listed = "{" + ",".join(choices) + "}" if choices else None  # --help shows the valid values: --sde_type {a,b}
    if is_list:
        kwargs.update(nargs=meta.get("nargs") or "+", type=str, metavar=listed or "VALUE")
    elif convert is _mapping:
        kwargs.update(nargs="+", type=str, metavar="KEY=VALUE")
    elif convert is str_to_bool:
        kwargs.update(nargs="?", const=True, type=str_to_bool, metavar="BOOL")
    else:
        kwargs.update(type=str, metavar=listed or field.name.upper())
        if choices:
            kwargs["choices"] = choices
    parser.add_argument(*names, **kwargs)


def from_dict(cls: Type[T], values: Dict[str, Any], *, source: str = "config") -> T:
    """Build ``cls`` from a dict, rejecting unknown keys with a suggestion."""
    fields = sections.fields_by_name(cls)
    aliases = {a: f.name for f in fields.values() for a in f.metadata.get("aliases", ())}
    kwargs = {}
    for key, value in values.items():
        name = aliases.get(key, key)
        if name not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3) if isinstance(key, str) else []
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{source}: unknown option {shorten(key)}.{hint} Run with --help for the full list.")
        kwargs[name] = coerce_value(fields[name], value)
    return sections.build(cls, kwargs, explicit=frozenset(kwargs))


def explicit_fields(config: Any) -> Optional[FrozenSet[str]]:
    """Names of the fields the YAML file or the command line set; None for a config built in code."""
    return getattr(config, _EXPLICIT_ATTR, None)


def replace_chosen(config: Any, **values: Any) -> Any:
    """``dataclasses.replace`` whose ``values`` count as chosen (:func:`is_explicit`), like the fields already chosen:
    settings filled in from a record (a checkpoint's run config) are then treated as if given on the command line."""
    recorded = explicit_fields(config)
    updated = sections.with_values(config, **values)
    if recorded is not None:
        sections.mark_explicit(updated, recorded | frozenset(values))
    return updated


def config_file(config: Any) -> Optional[str]:
    """The ``--config`` file a command line's values were read from (a file the run reads), None without one."""
    return getattr(config, _CONFIG_FILE_ATTR, None)


def is_explicit(config: Any, name: str) -> bool:
    """Whether field ``name`` was chosen by the user: named in the YAML file or on the command line. A config built
    in code (no record) counts a field as chosen when its value differs from the default."""
    recorded = explicit_fields(config)
    if recorded is not None:
        return name in recorded
    return dict(sections.flat_items(config))[name] != _default_of(sections.fields_by_name(type(config))[name])


def warn_no_effect(config: Any) -> List[str]:
    """Warn about each option the reference accepts but which does nothing, when set away from its default."""
    messages = []
    values = dict(sections.flat_items(config))
    for _, field in sections.option_fields(type(config)):
        reason = field.metadata.get("no_effect")
        if reason and values[field.name] != _default_of(field):
            messages.append(f"--{field.name} is accepted for compatibility with the reference but has no effect: {reason}")
            warnings.warn(messages[-1], stacklevel=3)
    return messages


class _OneLineErrorParser(argparse.ArgumentParser):
    """A bad option ends in one line on stderr (status 2), not the usage of a hundred flags."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message} (--help lists every option)", file=sys.stderr, flush=True)
        sys.exit(2)


def build_parser(cls: Type[Any], description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 usage="%(prog)s [-h] [--config FILE] [--option VALUE ...]")
    parser.add_argument("--config", default=None, help="YAML file of option values; command-line flags override it")
    for title, description, fields in sections.help_groups(cls):  # --help's topic groups: sections
        group = parser if title is None else parser.add_argument_group(title, description)
        for field in fields:
            _add_flag(group, field)
    return parser


def parse_cli(cls: Type[T], argv: Optional[Sequence[str]] = None, description: Optional[str] = None) -> T:
    """Resolve defaults < YAML (``--config``) < flags into an instance of ``cls``."""
    parser = build_parser(cls, description)
    args = vars(parser.parse_args(argv))
    config_path = args.pop("config")
    try:
        values: Dict[str, Any] = load_yaml(config_path) if config_path else {}
        values.update(args)
        config = from_dict(cls, values, source=f"--config {config_path}" if config_path else "command line")
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    if config_path:
        object.__setattr__(config, _CONFIG_FILE_ATTR, config_path)
    warn_no_effect(config)
    return config


def to_dict(config: Any) -> Dict[str, Any]:
    """``{option: value}`` of every option, flat (a sectioned configuration's sections merged), values copied."""
    return {name: copy.deepcopy(value) for name, value in sections.flat_items(config)}


def config_to_yaml(config: Any) -> str:
    """The resolved config as YAML text (what ``--config`` reads back)."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def save_yaml(config: Any, path: Path) -> None:
    """Write the resolved config (atomically: a crash leaves the old file or the new one); the file can be passed
    back with ``--config``."""
    from sage_grpo.safe_io import atomic_write  # imported here: this package must not import torch at start

    atomic_write(path, config_to_yaml(config))

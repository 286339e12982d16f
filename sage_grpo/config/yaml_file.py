"""The one reader of every YAML file the project reads (``--config``, a checkpoint's ``config.yaml``, a run's
``run_config.yaml``): plain data only, a size cap, a key given twice refused naming its line."""

from pathlib import Path
from typing import Any, Dict, Optional

import yaml

from sage_grpo.config.text import shorten

MAX_YAML_BYTES = 4 << 20  # a configuration is a few KiB; a file far larger is not one (and is not read whole)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ValueError):
    """A mapping of a YAML file names one key twice (YAML itself would keep the last value silently)."""


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (plain data only: no tag builds an object) that refuses a key given twice in a mapping."""

    def construct_mapping(self, node, deep=False):
        first: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:  # `<<:` merges may override
                key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                if key in first:
                    raise DuplicateKeyError(f"line {line}: key {shorten(key)} is given twice (first on line "
                                            f"{first[key]}); YAML would keep only the last value. Keep one")
                first[key] = line
        return super().construct_mapping(node, deep)


def _parse_yaml(text: str) -> Any:
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml(path: str, what: Optional[str] = None) -> Dict[str, Any]:
    """Read a YAML config file into a flat ``{field: value}`` dict: the one reader of every YAML file the project
    reads (``--config``, a checkpoint's ``config.yaml``, a run's ``run_config.yaml``). ``what`` names the file in
    errors (default ``--config PATH``). The values are built by ``yaml.SafeLoader`` and never expanded here: a value
    that is not the option's shape (a YAML alias bomb's shared lists) is refused by :func:`from_dict` unexpanded. A
    key given twice in one mapping is refused naming its line (YAML would keep the last one without a word)."""
    file = Path(path)
    what = what or f"--config {path}"
    if not file.is_file():
        raise FileNotFoundError(f"{what}: file {str(path)!r} does not exist")
    size = file.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ValueError(f"{what}: {size} bytes, more than the {MAX_YAML_BYTES} a configuration file may hold")
    try:
        data = _parse_yaml(file.read_text()) or {}
    except yaml.YAMLError as err:  # e.g. a !!python/object tag, which the safe loader refuses to build
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{what}{where}: not plain YAML data ({shorten(problem, quote=False)}). Option "
                         "values are strings, numbers, booleans and lists; tags such as !!python/object are refused"
                         ) from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{what}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:  # the YAML composer recurses once per level: [[[[...]]]]
        raise ValueError(f"{what}: nested too deeply to be a configuration") from None
    except ValueError as err:  # a constructor's, e.g. an integer of more than 4300 digits
        raise ValueError(f"{what}: {shorten(str(err), quote=False)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: the top level must be a mapping of option names to values")
    return data

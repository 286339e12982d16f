"""Settings files the project wrote and reads back, validated like the command line.

A checkpoint's ``config.yaml`` and a run directory's ``run_config.yaml`` are read again by a resume, a Slurm
requeue, ``export`` and ``generate.py``. They may have been edited, truncated or crafted since, so they get exactly
what ``--config`` gets: the one YAML reader (:func:`~sage_grpo.config.schema.load_yaml`), the options' types and
shapes (:func:`~sage_grpo.config.schema.from_dict`: a YAML alias bomb is refused unexpanded) and the value rules
that do not depend on the launch (:func:`~sage_grpo.config.validation.check_option_values`: finite numbers, ranges,
token lengths). Every failure is one :class:`ConfigError` line naming the file and the key, raised before anything
is loaded or written; the values that pass are typed data, never text pasted into what is written next.
"""

from pathlib import Path
from typing import Any, Dict, Union

from sage_grpo.config.schema import explicit_fields, from_dict, load_yaml, to_dict
from sage_grpo.config.validation import ConfigError, check_option_values

PathLike = Union[str, Path]


def read_recorded(path: PathLike, cls: type) -> Any:
    """The configuration of class ``cls`` a run recorded in ``path`` (its keys; every other option at its default).
    The training configuration's reader is ``sage_grpo.config.train.read_run_config``."""
    what = f"{path} (the run's recorded settings)"
    try:
        config = from_dict(cls, load_yaml(str(path), what), source=what)
        check_option_values(config)
    except FileNotFoundError:
        raise
    except ValueError as err:
        message = str(err)
        raise ConfigError(message if message.startswith(what) else f"{what}: {message}") from None
    return config


def recorded_values(config: Any) -> Dict[str, Any]:
    """``{option: value}`` of the options the file named (checked and typed), as :func:`read_recorded` read them."""
    named = explicit_fields(config) or frozenset()
    return {key: value for key, value in to_dict(config).items() if key in named}

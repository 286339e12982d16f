"""The launchers' reference flags yield to a ``--config`` file.

``run_post_train.sh`` and ``scripts/post_train/train_grpo.sh`` pass the reference's launch flags
(docs/reference.md#the-launch-scripts-flags) before the user's arguments. Flags beat YAML in ``parse_cli``, so those
defaults would silently override every ``--config`` value they also set (``--sde_type``, ``--kl_weight``, ...). With a
``--config`` among the user's arguments the launchers therefore drop each default flag whose option the file sets (by
field name or alias), so the order is: the launcher's defaults < the config file < flags typed on the command line.

    python -m sage_grpo.config.launcher CONFIG.yaml --flag value --bare_flag ...   -> the kept flags, one token a line
"""

import sys
from typing import List, Sequence

from sage_grpo.config.schema import build_parser, load_yaml


def _option_fields() -> dict:
    """Every spelling of every TrainConfig option (``--use_moving_KL``, field names, aliases) -> its field name."""
    from sage_grpo.config.train import TrainConfig

    parser = build_parser(TrainConfig)
    return {option.lstrip("-"): action.dest for action in parser._actions for option in action.option_strings}


def flags_not_in_config(config_path: str, flags: Sequence[str]) -> List[str]:
    """``flags`` without the options ``config_path`` sets; a flag's values are the tokens up to the next ``--``."""
    fields = _option_fields()
    in_config = {fields.get(key, key) for key in load_yaml(config_path)}
    kept: List[str] = []
    dropping = False
    for token in flags:
        if token.startswith("--"):
            dropping = fields.get(token[2:].split("=", 1)[0]) in in_config
        if not dropping:
            kept.append(token)
    return kept


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m sage_grpo.config.launcher CONFIG.yaml FLAG...", file=sys.stderr)
        return 2
    try:
        kept = flags_not_in_config(args[0], args[1:])
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Evaluation like the paper's Table 2: ``python -m sage_grpo.evaluate`` (``main``), see ``command``.

Modules: ``config`` (options), ``plan`` (validation before any model loads; generate.py's sampling settings),
``scoring`` (VideoAlign, CLIPScore, PickScore and any project reward, built once), ``runner`` (sampling, cache,
prompts over ranks), ``report`` (results.json, Table 2 markdown, bar chart, side-by-side pictures).
"""


def main(argv=None) -> int:
    from sage_grpo.evaluate.command import main as command_main

    return command_main(argv)


__all__ = ["main"]

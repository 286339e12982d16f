"""How a user's value is shown in an error message: bounded, so a huge or crafted value never floods the line."""

import reprlib
from typing import Any

MAX_ECHO_CHARS = 200  # longest user value an error message repeats


def _bounded_repr() -> reprlib.Repr:
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxlist, shown.maxtuple, shown.maxdict, shown.maxset = 3, 4, 4, 4, 4
    shown.maxstring = shown.maxother = 60
    return shown


_SHOWN = _bounded_repr()


def shorten(value: Any, limit: int = MAX_ECHO_CHARS, *, quote: bool = True) -> str:
    """The repr of a user value for an error message (a string as it is with ``quote=False``), at most about
    ``limit`` characters: a long string is cut and its length given ("... (N chars)"); a container shows a few items
    of a few levels, so a YAML alias bomb (a shared list referenced from thousands of places) is never expanded."""
    if isinstance(value, str):
        text = repr(value[:limit]) if quote else value[:limit]
        return text if len(value) <= limit else f"{text}... ({len(value)} chars)"
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."

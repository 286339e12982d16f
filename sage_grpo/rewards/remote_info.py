"""The reward server's ``GET /info`` answer, checked before a run starts (the client is :mod:`.remote`).

The answer is data from another process: a wrong address, another program or a broken server can answer any JSON.
Every field the client reads is checked for its type, finiteness, range and length, so an absurd value (a negative or
NaN limit, a frame rate of 1e300, a million metric names) ends the start in one line naming the server's URL, the
field and its value, instead of a traceback or requests that can never fit. The server's own values are far inside
these bounds (``--max_request_mb`` 1024, ``--max_videos_per_request`` 64, a handful of metrics), and its options
stop at the same ones (:mod:`sage_grpo.config.reward_server`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sage_grpo.config.reward_server import MAX_REQUEST_MB, MAX_VIDEO_FPS, MAX_VIDEOS_PER_REQUEST
from sage_grpo.config.schema import shorten

INFO_FIELDS = ("reward_model", "metric_names", "video_fps", "max_request_bytes", "max_videos_per_request")
MAX_NAME_CHARS = 1000  # a reward model's name (a dotted path 'package.module:callable' included) or a metric's
MAX_METRICS = 256
MAX_REQUEST_BYTES = MAX_REQUEST_MB << 20  # the server's options stop at the same bounds


class ServerInfo(NamedTuple):
    """The checked ``/info`` answer."""

    reward_model: str
    metric_names: tuple[str, ...] | None  # None: the server's reward declares none
    video_fps: float
    max_request_bytes: int
    max_videos_per_request: int


class InfoFieldError(ValueError):
    """One ``/info`` field out of its type or range; the message names the field, its value and what is expected."""


def _refuse(field: str, value: Any, expected: str) -> InfoFieldError:
    return InfoFieldError(f"its {field} is {shorten(value, 100)}, expected {expected}")


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise _refuse(field, value, f"a name of 1 to {MAX_NAME_CHARS} characters")
    return value


def _count(field: str, value: Any, limit: int) -> int:
    if type(value) is not int or not 1 <= value <= limit:  # type(): a bool or a float is not a count
        raise _refuse(field, value, f"an integer from 1 to {limit}")
    return value


def _metric_names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_METRICS:
        raise _refuse("metric_names", value, f"null or a list of at most {MAX_METRICS} names")
    names = tuple(_name(f"metric_names[{i}]", name) for i, name in enumerate(value))
    if len(set(names)) != len(names):
        raise _refuse("metric_names", value, "distinct names")
    return names or None  # an empty list declares nothing, as null does


def check_server_info(info: Any) -> ServerInfo:
    """``info`` (the parsed JSON of ``GET /info``) -> :class:`ServerInfo`; :class:`InfoFieldError` for a missing
    field or a value out of its type or range (the caller adds the URL)."""
    if not isinstance(info, dict):
        raise InfoFieldError(f"it is {shorten(info, 100)}, expected a JSON object")
    missing = [field for field in INFO_FIELDS if field not in info]
    if missing:
        raise InfoFieldError(f"it has no {', '.join(missing)} (its keys: {shorten(sorted(info)[:10], 200)})")
    fps = info["video_fps"]
    # the comparisons are exact for an integer of any size; NaN and the infinities fail them
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= MAX_VIDEO_FPS:
        raise _refuse("video_fps", fps, f"a number of frames per second in (0, {MAX_VIDEO_FPS}]")
    return ServerInfo(
        reward_model=_name("reward_model", info["reward_model"]),
        metric_names=_metric_names(info["metric_names"]),
        video_fps=float(fps),
        max_request_bytes=_count("max_request_bytes", info["max_request_bytes"], MAX_REQUEST_BYTES),
        max_videos_per_request=_count("max_videos_per_request", info["max_videos_per_request"],
                                      MAX_VIDEOS_PER_REQUEST),
    )

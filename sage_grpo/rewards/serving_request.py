"""A ``/score`` request on the reward server: its limits and its decoding, every field checked (wire format in
:mod:`sage_grpo.rewards.remote`; the server in :mod:`sage_grpo.rewards.serving`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import torch

from .remote import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES

HEADER_KEYS = {"prompts", "shape", "dtype", "video_fps"}
MAX_JSON_DEPTH = 4  # the header is {"prompts": [...], "shape": [...]}: depth 2
# a JSON string (an unterminated one runs to the end: one linear pass, no backtracking) or a bracket
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


@dataclass(frozen=True)
class ServerLimits:
    """What one ``/score`` request may hold."""

    max_request_bytes: int = 1 << 30  # 1 GiB: ~20 videos of 81x352x624
    max_videos_per_request: int = 64
    max_frames: int = 2048
    max_side: int = 4096
    max_prompt_chars: int = 20000
    max_buffered_bytes: int = 2 << 30  # request bodies in memory at once, over all connections
    max_connections: int = 16  # authenticated requests served at once
    max_pending_connections: int = 256  # connections not (yet) holding a serving slot
    header_timeout_s: float = 1.0  # longest time to deliver the request line and headers (before authentication)
    idle_timeout_s: float = 30.0  # longest silence while a request is read (or its answer written)
    request_timeout_s: float = 300.0  # longest time to deliver one whole request (headers and body)


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _positive_ints(values, label: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int and v > 0 for v in values):
        raise RequestError(f"{label} must be a list of positive integers, got {values!r}"[:300])
    return values


def check_json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` without parsing it (``json.loads`` recurses once per level)."""
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group()[0] == '"':  # brackets inside strings do not nest
            continue
        depth += 1 if token.group() in "[{" else -1
        if depth > limit:
            raise RequestError(f"the header nests deeper than {limit} levels; expected a flat JSON object")


def decode_request(body: bytes | bytearray, limits: ServerLimits, video_fps: float) -> tuple[torch.Tensor, list[str]]:
    """A ``/score`` body -> ``(uint8 videos (B, 3, F, H, W), prompts)``, every field checked."""
    if len(body) < HEADER_LENGTH_BYTES:
        raise RequestError("the body is shorter than its 4-byte header length")
    header_length = int.from_bytes(body[:HEADER_LENGTH_BYTES], "big")
    if not 2 <= header_length <= min(MAX_HEADER_BYTES, len(body) - HEADER_LENGTH_BYTES):
        raise RequestError(f"header length {header_length} is outside [2, {MAX_HEADER_BYTES}] or beyond the body")
    try:
        text = bytes(body[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + header_length]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"the header is not UTF-8 JSON: {err}") from None
    check_json_depth(text)
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as err:  # RecursionError: only for malformed text the depth check misread
        raise RequestError(f"the header is not UTF-8 JSON: {err}") from None
    if not isinstance(header, dict) or set(header) != HEADER_KEYS:
        keys = sorted(header) if isinstance(header, dict) else type(header).__name__
        raise RequestError(f"the header must have exactly the keys {sorted(HEADER_KEYS)}, got {keys}")
    if header["dtype"] != "uint8":
        raise RequestError(f"dtype must be 'uint8', got {header['dtype']!r}")
    shape = _positive_ints(header["shape"], "shape")
    if len(shape) != 5 or shape[4] != 3:
        raise RequestError(f"shape must be [B, F, H, W, 3], got {shape}")
    batch, frames, height, width, _ = shape
    if batch > limits.max_videos_per_request or frames > limits.max_frames or max(height, width) > limits.max_side:
        raise RequestError(f"shape {shape} exceeds the limits: <= {limits.max_videos_per_request} videos, "
                           f"<= {limits.max_frames} frames, sides <= {limits.max_side}", status=413)
    prompts = header["prompts"]
    if (not isinstance(prompts, list) or len(prompts) != batch
            or not all(isinstance(p, str) and len(p) <= limits.max_prompt_chars for p in prompts)):
        raise RequestError(f"prompts must be a list of {batch} strings of at most {limits.max_prompt_chars} "
                           "characters")
    fps = header["video_fps"]
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or float(fps) != video_fps:
        raise RequestError(f"video_fps {fps!r} is not the server's {video_fps} (its --video_fps); frames would be "
                           "sampled at the wrong times")
    offset = HEADER_LENGTH_BYTES + header_length
    if len(body) - offset != math.prod(shape):
        raise RequestError(f"{len(body) - offset} frame bytes do not fill shape {shape} ({math.prod(shape)} bytes)")
    buffer = body if isinstance(body, bytearray) else bytearray(body)  # the server's own bytearray: used in place
    videos = torch.frombuffer(buffer, dtype=torch.uint8, offset=offset, count=math.prod(shape)).view(shape)
    return videos.permute(0, 4, 1, 2, 3), prompts  # (B, 3, F, H, W): a view of the body, no copy


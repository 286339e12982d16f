"""The reward server behind ``--remote_reward_url``: one reward model, scored over HTTP for any number of trainers.

``scripts/reward_server.py`` is the entry point; the wire format is in :mod:`sage_grpo.rewards.remote`. The server
builds the reward from the same flags and registry as training (``--reward_model``, ``--reward_kwargs``,
``--pretrained_model_root``, ``--reward_checkpoint_mode``, ``--videoalign_*``, ...) and returns its raw metrics;
weights and ``avg`` stay with the trainer.

Every request is untrusted input: nothing is unpickled or evaluated, the body size is checked against
``Content-Length`` before it is read, the JSON header must have exactly the expected keys and types, the frames
must be uint8 of shape ``(B, F, H, W, 3)`` within the limits and fill the body exactly, and the frame rate must be
the server's. A bad request gets 400 (413 when too large) and a JSON ``{"error": ...}`` naming the problem. Samples
on which the reward fails score null (NaN) under the same failure policy as a local reward (``score_with_fallback``);
anything else the server did not expect is a 500, which the client retries. Requests are scored one at a time
(the model is not shared between threads); the threaded server keeps accepting connections meanwhile.

A server on a shared cluster meets stalled and hostile clients, so every resource a connection takes is bounded:

* a connection that sends nothing for ``idle_timeout_s`` is dropped, and so is one that has not delivered its whole
  request within ``request_timeout_s`` (a client trickling one byte a second cannot hold a thread forever);
* at most ``max_connections`` connections are served at once; the next one gets an immediate 503 and is closed;
* request bodies held in memory at once (read, queued for the model, being scored) total at most
  ``max_buffered_bytes``; a request that would pass it gets 503 before its body is read (the client retries 5xx);
* with ``--auth_token_file`` every request must carry ``Authorization: Bearer <token>`` (compared in constant
  time); anything else gets 401 before its body is read;
* the JSON header may nest at most ``MAX_JSON_DEPTH`` levels (the expected one has 2), checked before parsing, so a
  deeply nested header is a 400, not a recursion error.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import socket
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from .base import metric_names_of, score_with_fallback
from .remote import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES

HEADER_KEYS = {"prompts", "shape", "dtype", "video_fps"}
MAX_JSON_DEPTH = 4  # the header is {"prompts": [...], "shape": [...]}: depth 2
MIN_TOKEN_CHARS = 16
BODY_CHUNK_BYTES = 1 << 20
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
    max_connections: int = 16
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
    payload = memoryview(body)[HEADER_LENGTH_BYTES + header_length:]
    if len(payload) != math.prod(shape):
        raise RequestError(f"{len(payload)} frame bytes do not fill shape {shape} ({math.prod(shape)} bytes)")
    videos = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(shape)
    return videos.permute(0, 4, 1, 2, 3).contiguous(), prompts  # (B, 3, F, H, W), laid out as a local batch


class RewardService:
    """One reward callable behind ``/info`` and ``/score``; ``auth_token`` (None: no authentication) is the shared
    secret every request must carry."""

    def __init__(self, reward_fn, reward_model: str, *, video_fps: float, batch_size: int | None = None,
                 limits: ServerLimits = ServerLimits(), auth_token: str | None = None):
        self.reward_fn = reward_fn
        self.reward_model = reward_model
        self.video_fps = float(video_fps)
        self.batch_size = batch_size
        self.limits = limits
        self.metric_names = metric_names_of(reward_fn)
        self._expected_authorization = None if auth_token is None else f"Bearer {auth_token}".encode()
        self._lock = threading.Lock()
        self._buffer_lock = threading.Lock()
        self.buffered_bytes = 0

    def info(self) -> dict:
        return {"reward_model": self.reward_model, "metric_names": self.metric_names, "video_fps": self.video_fps,
                "max_request_bytes": self.limits.max_request_bytes,
                "max_videos_per_request": self.limits.max_videos_per_request}

    def authorized(self, authorization: str | None) -> bool:
        if self._expected_authorization is None:
            return True
        given = (authorization or "").encode("latin-1", "replace")  # header values arrive as latin-1 text
        return hmac.compare_digest(given, self._expected_authorization)

    def reserve_buffer(self, num_bytes: int) -> None:
        """Count a body about to be read against ``max_buffered_bytes`` (503 if it does not fit); pair with
        :meth:`release_buffer` once the request is answered."""
        with self._buffer_lock:
            if self.buffered_bytes + num_bytes > self.limits.max_buffered_bytes:
                raise RequestError(f"the server holds {self.buffered_bytes} bytes of requests; {num_bytes} more "
                                   f"would pass its limit of {self.limits.max_buffered_bytes}; retry later", 503)
            self.buffered_bytes += num_bytes

    def release_buffer(self, num_bytes: int) -> None:
        with self._buffer_lock:
            self.buffered_bytes -= num_bytes

    def _reward_of_uint8(self, videos: torch.Tensor, prompts: list[str]):
        return self.reward_fn(videos.float() / 255.0, prompts)  # per chunk: the float copy stays chunk-sized

    def score(self, body: bytes | bytearray) -> dict:
        videos, prompts = decode_request(body, self.limits, self.video_fps)
        with self._lock:
            scores = score_with_fallback(self._reward_of_uint8, videos, prompts, name=self.reward_model,
                                         batch_size=self.batch_size, metric_names=self.metric_names)
        return {"scores": {metric: [v if math.isfinite(v) else None for v in values.tolist()]
                           for metric, values in scores.items()}}


class _ConnectionDropped(Exception):
    """The client stalled or went away mid-request: close without an answer (nobody reads it)."""


def _handler_class(service: RewardService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        @property
        def timeout(self) -> float:  # StreamRequestHandler sets it on the socket: bounds every read and write
            return service.limits.idle_timeout_s

        def setup(self):
            super().setup()
            # a hard bound on delivering the request: shutting the socket down ends any blocked read with EOF
            self._deadline = threading.Timer(service.limits.request_timeout_s, self._drop)
            self._deadline.daemon = True
            self._deadline.start()

        def _drop(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self):
            self._deadline.cancel()
            super().finish()

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refuse_unauthorized(self) -> bool:
            if service.authorized(self.headers.get("Authorization")):
                return False
            self.close_connection = True  # the body, if any, is never read
            self._answer(401, {"error": "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                                        "token of the server's --auth_token_file (the client reads it from "
                                        "SAGE_GRPO_REWARD_TOKEN)"})
            return True

        def do_GET(self):  # noqa: N802 - http.server's naming
            self._deadline.cancel()
            if self._refuse_unauthorized():
                return
            if self.path != "/info":
                return self._answer(404, {"error": f"unknown path {self.path!r}; use GET /info or POST /score"})
            self._answer(200, service.info())

        def do_POST(self):  # noqa: N802
            if self._refuse_unauthorized():
                return
            if self.path != "/score":
                self.close_connection = True
                return self._answer(404, {"error": f"unknown path {self.path!r}; use POST /score"})
            try:
                length = self._content_length()
                service.reserve_buffer(length)
            except RequestError as err:
                self.close_connection = True
                return self._answer(err.status, {"error": str(err)})
            try:
                self._score(length)
            finally:
                service.release_buffer(length)

        def _score(self, length: int) -> None:
            try:
                body = self._read_body(length)
                self._deadline.cancel()  # delivered: scoring may take as long as the model needs
                self._answer(200, service.score(body))
            except _ConnectionDropped:
                self.close_connection = True
            except RequestError as err:
                self._answer(err.status, {"error": str(err)})
            except Exception as err:  # noqa: BLE001 - reported to the client as a 500, which it retries
                traceback.print_exc()
                self._answer(500, {"error": f"{type(err).__name__}: {err}"})

        def _content_length(self) -> int:
            length = self.headers.get("Content-Length", "")
            if not (length.isascii() and length.isdigit()):
                raise RequestError("a Content-Length header is required", status=411)
            if int(length) > service.limits.max_request_bytes:
                raise RequestError(f"the body of {length} bytes exceeds --max_request_mb "
                                   f"({service.limits.max_request_bytes} bytes); send fewer videos", status=413)
            return int(length)

        def _read_body(self, length: int) -> bytearray:
            body = bytearray()
            while len(body) < length:  # each read waits at most idle_timeout_s; the deadline bounds the total
                try:
                    chunk = self.rfile.read(min(BODY_CHUNK_BYTES, length - len(body)))
                except (TimeoutError, ConnectionError) as err:
                    raise _ConnectionDropped() from err
                if not chunk:
                    raise _ConnectionDropped()
                body += chunk
            return body

    return Handler


class RewardHTTPServer(ThreadingHTTPServer):
    """The threaded server with a cap on concurrent connections (the next one gets 503 and is closed at once)."""

    daemon_threads = True

    def __init__(self, address, handler_class, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler_class)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its slot would never come back
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # a client that vanished or a connection dropped at its deadline
            print(f"reward server: connection from {client_address[0]} ended: {err}", file=sys.stderr)
        else:
            super().handle_error(request, client_address)


def _refuse_busy(request: socket.socket) -> None:
    """Answer 503 from the accepting thread: a few hundred bytes fit any send buffer, and the timeout bounds it."""
    data = b'{"error": "the reward server is at its connection limit (--max_connections); retry later"}'
    try:
        request.settimeout(1.0)
        request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
    except OSError:
        pass


def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 8765) -> RewardHTTPServer:
    """A threaded HTTP server for ``service`` (port 0 picks a free port: see ``server.server_address``)."""
    return RewardHTTPServer((host, port), _handler_class(service), service.limits.max_connections)


def read_auth_token(path: str) -> str:
    """``--auth_token_file``: the shared secret, one line of at least ``MIN_TOKEN_CHARS`` characters."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--auth_token_file {path}: cannot read it ({err})") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"--auth_token_file {path}: the token must be one line of at least {MIN_TOKEN_CHARS} "
                         "printable characters without spaces, e.g. python -c 'import secrets; "
                         "print(secrets.token_hex(32))' > token")
    return token


def service_from_config(cfg) -> RewardService:
    """The service a :class:`~sage_grpo.config.reward_server.RewardServerConfig` describes (the reward is built
    through the trainer's registry, so every name, plug-in rule and check is the same)."""
    from sage_grpo.dtypes import DTYPES

    from .registry import RewardContext, make_reward, plan_reward_models
    from .videoalign_inputs import SamplingOverrides

    models = plan_reward_models(cfg.reward_model, None, cfg.reward_kwargs, batch_size=cfg.reward_batch_size)
    name = next(iter(models))
    sampling = SamplingOverrides(cfg.videoalign_fps, cfg.videoalign_num_frames, cfg.videoalign_max_pixels)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ctx = RewardContext(cfg.pretrained_model_root, cfg.reward_checkpoint_mode, device, DTYPES[cfg.dtype],
                        float(cfg.video_fps), cfg.reward_from_mp4, sampling)
    limits = ServerLimits(max_request_bytes=cfg.max_request_mb << 20,
                          max_videos_per_request=cfg.max_videos_per_request,
                          max_buffered_bytes=cfg.max_buffered_mb << 20, max_connections=cfg.max_connections,
                          idle_timeout_s=cfg.idle_timeout_s, request_timeout_s=cfg.request_timeout_s)
    token = read_auth_token(cfg.auth_token_file) if cfg.auth_token_file else None  # before the model loads
    return RewardService(make_reward(name, ctx, models[name]["kwargs"]), name, video_fps=cfg.video_fps,
                         batch_size=cfg.reward_batch_size, limits=limits, auth_token=token)

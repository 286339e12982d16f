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

* a new connection has ``header_timeout_s`` (1 s) to deliver its request line and headers, then it is closed: a
  client that has not authenticated holds a thread for about a second at most, however slowly it trickles;
* a request holds one of the ``max_connections`` serving slots only once its headers have arrived and its token is
  accepted; the next authenticated request gets 503 (the client retries 5xx). Connections that have not got that
  far are capped separately (``max_pending_connections``, beyond which a new connection gets 503 at once), so idle
  or trickling strangers cannot take the slots of the trainers;
* a connection that sends nothing for ``idle_timeout_s`` is dropped, and so is one that has not delivered its whole
  request within ``request_timeout_s`` (a client trickling its body one byte a second cannot hold a slot forever);
* request bodies held in memory at once (read, queued for the model, being scored) total at most
  ``max_buffered_bytes``; a request that would pass it gets 503 before its body is read. Each body is held once: it
  is read into one buffer of its ``Content-Length`` and the frames handed to the model are a view of it; the one
  request being scored adds its current chunk of ``--reward_batch_size`` videos in float32 (4 bytes per value) and
  what the model itself needs, so memory is bounded by ``max_buffered_bytes`` plus one chunk;
* with ``--auth_token_file`` every request must carry ``Authorization: Bearer <token>`` (compared in constant
  time); anything else gets 401 before its body is read;
* the JSON header may nest at most ``MAX_JSON_DEPTH`` levels (the expected one has 2), checked before parsing, so a
  deeply nested header is a 400, not a recursion error.

The server's log lines show request paths with any query string masked (``?***``), so a token a client put in a URL
is not printed; ``sage-grpo serve-reward`` warns at start when it listens beyond the loopback interface without a
token.

Why ``http.server`` and not an ASGI server or aiohttp (tried, docs/configuration.md "Why the standard library"):
uvicorn bounds no request head in time, so connections trickling a header kept its ``limit_concurrency`` slots past
its keep-alive timeout and every authenticated request got 503; aiohttp closes a connection without a complete head
after its keep-alive timeout, but the rest (the token before the body, the buffered-bytes cap, one copy of the body,
the body's deadline) is this module's code either way, and it would add eight packages (five compiled) to every
install for this one optional process.
"""

from __future__ import annotations

import hmac
import ipaddress
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
from .remote import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES, redact_secrets

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
        self.requires_token = auth_token is not None
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
        # per chunk, one float copy laid out (B, 3, F, H, W) and scaled in place: the same values as float() / 255
        frames = torch.empty(videos.shape, dtype=torch.float32).copy_(videos).div_(255.0)
        return self.reward_fn(frames, prompts)

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
            self._slot = False
            # hard bounds: shutting the socket down ends any blocked read with EOF. The head's is short: until its
            # headers have arrived a client is unauthenticated; the whole request's covers a trickled body
            self._deadlines = [threading.Timer(seconds, self._drop) for seconds in
                               (service.limits.header_timeout_s, service.limits.request_timeout_s)]
            for deadline in self._deadlines:
                deadline.daemon = True
                deadline.start()

        def _drop(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def parse_request(self) -> bool:  # reads the headers: the head has arrived when it returns
            parsed = super().parse_request()
            self._deadlines[0].cancel()
            return parsed

        def finish(self):
            for deadline in self._deadlines:
                deadline.cancel()
            if self._slot:
                self.server.release_slot()
            super().finish()

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            super().log_message("%s", redact_secrets(format % args))  # no query string or userinfo in a log line

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _admitted(self) -> bool:
            """Authenticated and holding a serving slot; otherwise answered (401 or 503), closed, False."""
            if not service.authorized(self.headers.get("Authorization")):
                self.close_connection = True  # the body, if any, is never read
                self._answer(401, {"error": "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                                            "token of the server's --auth_token_file (the client reads it from "
                                            "SAGE_GRPO_REWARD_TOKEN)"})
                return False
            self._slot = self.server.take_slot()
            if not self._slot:
                self.close_connection = True
                self._answer(503, {"error": f"the reward server is serving --max_connections "
                                            f"{service.limits.max_connections} requests; retry later"})
            return self._slot

        def do_GET(self):  # noqa: N802 - http.server's naming
            self._deadlines[1].cancel()
            if not self._admitted():
                return
            if self.path != "/info":
                return self._answer(404, {"error": f"unknown path {self.path!r}; use GET /info or POST /score"})
            self._answer(200, service.info())

        def do_POST(self):  # noqa: N802
            if not self._admitted():
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
                self._deadlines[1].cancel()  # delivered: scoring may take as long as the model needs
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
            """The body, read into one buffer of its length (no growing copies; the frames become a view of it)."""
            body = bytearray(length)
            with memoryview(body) as view:
                done = 0
                while done < length:  # each read waits at most idle_timeout_s; the deadline bounds the total
                    try:
                        count = self.rfile.readinto(view[done:done + BODY_CHUNK_BYTES])
                    except (TimeoutError, ConnectionError) as err:
                        raise _ConnectionDropped() from err
                    if not count:
                        raise _ConnectionDropped()
                    done += count
            return body

    return Handler


class RewardHTTPServer(ThreadingHTTPServer):
    """The threaded server: every connection has a thread, at most ``max_connections + max_pending_connections`` at
    once (the next one gets 503 and is closed); an authenticated request takes one of ``max_connections`` serving
    slots (:meth:`take_slot`) for as long as it is read, scored and answered."""

    daemon_threads = True

    def __init__(self, address, handler_class, limits: ServerLimits):
        self._open = threading.BoundedSemaphore(limits.max_connections + limits.max_pending_connections)
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(address, handler_class)

    def take_slot(self) -> bool:
        return self._slots.acquire(blocking=False)

    def release_slot(self) -> None:
        self._slots.release()

    def process_request(self, request, client_address):
        if not self._open.acquire(blocking=False):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its place would never come back
            self._open.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._open.release()

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # a client that vanished or a connection dropped at its deadline
            print(f"reward server: connection from {client_address[0]} ended: {err}", file=sys.stderr)
        else:
            super().handle_error(request, client_address)


def _refuse_busy(request: socket.socket) -> None:
    """Answer 503 from the accepting thread: a few hundred bytes fit any send buffer, and the timeout bounds it."""
    data = b'{"error": "the reward server has as many connections open as it allows; retry later"}'
    try:
        request.settimeout(1.0)
        request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
    except OSError:
        pass


def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 8765) -> RewardHTTPServer:
    """A threaded HTTP server for ``service`` (port 0 picks a free port: see ``server.server_address``)."""
    return RewardHTTPServer((host, port), _handler_class(service), service.limits)


def exposure_warning(bound_host: str, service: RewardService) -> str | None:
    """The warning for a server reachable from other machines without a token (None on the loopback interface or
    with ``--auth_token_file``); ``bound_host`` is the address the socket is bound to."""
    if service.requires_token:
        return None
    try:
        if ipaddress.ip_address(bound_host).is_loopback:
            return None
    except ValueError:
        pass
    return (f"warning: the reward server listens on {bound_host}, reachable from other machines, without "
            "--auth_token_file: anyone who reaches the port can use the reward model and its GPU; pass "
            "--auth_token_file (the trainers then set SAGE_GRPO_REWARD_TOKEN) or --host 127.0.0.1")


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
                          header_timeout_s=cfg.header_timeout_s, idle_timeout_s=cfg.idle_timeout_s,
                          request_timeout_s=cfg.request_timeout_s)
    token = read_auth_token(cfg.auth_token_file) if cfg.auth_token_file else None  # before the model loads
    return RewardService(make_reward(name, ctx, models[name]["kwargs"]), name, video_fps=cfg.video_fps,
                         batch_size=cfg.reward_batch_size, limits=limits, auth_token=token)

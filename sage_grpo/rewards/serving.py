"""The reward server behind ``--remote_reward_url``: one reward model, scored over HTTP for any number of trainers.

``scripts/reward_server.py`` is the entry point; the wire format is in :mod:`sage_grpo.rewards.remote`, a request's
limits and decoding in :mod:`sage_grpo.rewards.serving_request`, the HTTP handler and server in
:mod:`sage_grpo.rewards.serving_http`. The server builds the reward from the same flags and registry as training
(``--reward_model``, ``--reward_kwargs``, ``--pretrained_model_root``, ``--reward_checkpoint_mode``,
``--videoalign_*``, ...) and returns its raw metrics; weights and ``avg`` stay with the trainer.

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
  is read into one buffer of its ``Content-Length`` and the frames are a view of it. A reward that declares
  ``accepts_uint8`` (VideoAlign does) is handed that view; for any other the one request being scored adds its
  current chunk of ``--reward_batch_size`` videos in float32 (4 bytes per value: 4x the body when the request is one
  chunk, as a trainer's are). With what the model itself needs, memory is bounded by ``max_buffered_bytes`` plus one
  float chunk (none for a uint8 reward);
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
the body's deadline) is this package's code either way, and it would add eight packages (five compiled) to every
install for this one optional process.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import threading
from pathlib import Path

import torch

from .base import accepts_uint8, metric_names_of, score_with_fallback
from .serving_http import RewardHTTPServer, RewardRequestHandler
from .serving_request import MAX_JSON_DEPTH, RequestError, ServerLimits, check_json_depth, decode_request

__all__ = ["MAX_JSON_DEPTH", "MIN_TOKEN_CHARS", "RequestError", "RewardHTTPServer", "RewardRequestHandler",
           "RewardService", "ServerLimits", "check_json_depth", "decode_request", "exposure_warning", "make_server",
           "read_auth_token", "service_from_config"]

MIN_TOKEN_CHARS = 16


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
        self.takes_uint8 = accepts_uint8(reward_fn)
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
        if self.takes_uint8:  # the body's frames as they are: no copy
            return self.reward_fn(videos, prompts)
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



def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 8765) -> RewardHTTPServer:
    """A threaded HTTP server for ``service`` (port 0 picks a free port: see ``server.server_address``)."""
    return RewardHTTPServer((host, port), service)


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

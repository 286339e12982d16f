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
"""

from __future__ import annotations

import json
import math
import threading
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from .base import metric_names_of, score_with_fallback
from .remote import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES

HEADER_KEYS = {"prompts", "shape", "dtype", "video_fps"}


@dataclass(frozen=True)
class ServerLimits:
    """What one ``/score`` request may hold."""

    max_request_bytes: int = 1 << 30  # 1 GiB: ~20 videos of 81x352x624
    max_videos_per_request: int = 64
    max_frames: int = 2048
    max_side: int = 4096
    max_prompt_chars: int = 20000


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _positive_ints(values, label: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int and v > 0 for v in values):
        raise RequestError(f"{label} must be a list of positive integers, got {values!r}"[:300])
    return values


def decode_request(body: bytes, limits: ServerLimits, video_fps: float) -> tuple[torch.Tensor, list[str]]:
    """A ``/score`` body -> ``(uint8 videos (B, 3, F, H, W), prompts)``, every field checked."""
    if len(body) < HEADER_LENGTH_BYTES:
        raise RequestError("the body is shorter than its 4-byte header length")
    header_length = int.from_bytes(body[:HEADER_LENGTH_BYTES], "big")
    if not 2 <= header_length <= min(MAX_HEADER_BYTES, len(body) - HEADER_LENGTH_BYTES):
        raise RequestError(f"header length {header_length} is outside [2, {MAX_HEADER_BYTES}] or beyond the body")
    try:
        header = json.loads(body[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + header_length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
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
    """One reward callable behind ``/info`` and ``/score``."""

    def __init__(self, reward_fn, reward_model: str, *, video_fps: float, batch_size: int | None = None,
                 limits: ServerLimits = ServerLimits()):
        self.reward_fn = reward_fn
        self.reward_model = reward_model
        self.video_fps = float(video_fps)
        self.batch_size = batch_size
        self.limits = limits
        self.metric_names = metric_names_of(reward_fn)
        self._lock = threading.Lock()

    def info(self) -> dict:
        return {"reward_model": self.reward_model, "metric_names": self.metric_names, "video_fps": self.video_fps,
                "max_request_bytes": self.limits.max_request_bytes,
                "max_videos_per_request": self.limits.max_videos_per_request}

    def _reward_of_uint8(self, videos: torch.Tensor, prompts: list[str]):
        return self.reward_fn(videos.float() / 255.0, prompts)  # per chunk: the float copy stays chunk-sized

    def score(self, body: bytes) -> dict:
        videos, prompts = decode_request(body, self.limits, self.video_fps)
        with self._lock:
            scores = score_with_fallback(self._reward_of_uint8, videos, prompts, name=self.reward_model,
                                         batch_size=self.batch_size, metric_names=self.metric_names)
        return {"scores": {metric: [v if math.isfinite(v) else None for v in values.tolist()]
                           for metric, values in scores.items()}}


def _handler_class(service: RewardService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path != "/info":
                return self._answer(404, {"error": f"unknown path {self.path!r}; use GET /info or POST /score"})
            self._answer(200, service.info())

        def do_POST(self):  # noqa: N802
            if self.path != "/score":
                return self._answer(404, {"error": f"unknown path {self.path!r}; use POST /score"})
            try:
                self._answer(200, service.score(self._read_body()))
            except RequestError as err:
                self._answer(err.status, {"error": str(err)})
            except Exception as err:  # noqa: BLE001 - reported to the client as a 500, which it retries
                traceback.print_exc()
                self._answer(500, {"error": f"{type(err).__name__}: {err}"})

        def _read_body(self) -> bytes:
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                raise RequestError("a Content-Length header is required", status=411)
            if int(length) > service.limits.max_request_bytes:
                raise RequestError(f"the body of {length} bytes exceeds --max_request_mb "
                                   f"({service.limits.max_request_bytes} bytes); send fewer videos", status=413)
            body = self.rfile.read(int(length))
            if len(body) != int(length):
                raise RequestError(f"the body ended after {len(body)} of {length} bytes")
            return body

    return Handler


def make_server(service: RewardService, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``service`` (port 0 picks a free port: see ``server.server_address``)."""
    server = ThreadingHTTPServer((host, port), _handler_class(service))
    server.daemon_threads = True
    return server


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
                          max_videos_per_request=cfg.max_videos_per_request)
    return RewardService(make_reward(name, ctx, models[name]["kwargs"]), name, video_fps=cfg.video_fps,
                         batch_size=cfg.reward_batch_size, limits=limits)

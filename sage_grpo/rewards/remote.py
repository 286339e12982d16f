"""A reward scored by a reward server (``--remote_reward_url``; the server is ``scripts/reward_server.py``).

The trainer's reward model (``--reward_model``, VideoAlign by default) can run in another process or on another
machine: a GPU of its own, one copy for many trainers. ``RemoteReward`` is a reward callable like the local one:
``videos (B, 3, F, H, W)`` in [0, 1] and B prompts give the same ``{metric: tensor (B,)}`` the local reward gives,
so the composite's weights, ``avg``, logging and failure policy do not change.

Wire format (HTTP, no pickle anywhere; the server treats every request as untrusted):

* ``GET /info`` -> JSON ``{"reward_model", "metric_names", "video_fps", "max_request_bytes",
  "max_videos_per_request"}``; the client checks every field's type and range (:mod:`.remote_info`), then the model
  and frame rate against its own, at construction.
* ``POST /score``, ``Content-Type: application/octet-stream``, body = 4-byte big-endian header length, a UTF-8 JSON
  header ``{"prompts": [B strings], "shape": [B, F, H, W, 3], "dtype": "uint8", "video_fps": fps}``, then the
  frames as raw uint8 bytes in that shape (C order). Response: JSON ``{"scores": {metric: [B floats or null]}}``
  (null = the sample failed on the server and scores NaN), or ``{"error": message}`` with status 4xx/5xx.

Frames travel as uint8, ``round(255 * clamp(x, 0, 1))``: 4x smaller than float32 and what a saved rollout holds.
Videos already on the 8-bit grid (k / 255, e.g. decoded files) score exactly as locally; others differ by that
rounding (at most half a level; the reference scores mp4 files, which lose more).

Batching and failures: a call is sent in as few requests as the server's limits allow. A connection error, a
timeout or a 5xx response is retried ``retries`` times with exponential backoff (``backoff_s``, doubling); after the
last failure the call's samples score NaN with a ``RuntimeWarning``, exactly like a local reward that fails, so the
trainer counts the step as failed (``--max_failed_reward_steps``). A 4xx response (the server rejected the request)
is not retried.

Start-up: the client probes ``GET /info`` once with ``probe_timeout_s`` (a few seconds, not the scoring timeout), so
a wrong URL or a silent server ends the run at once with one line naming the URL and what to check; so does an
answer with a field out of its type or range (:mod:`.remote_info`), another reward model or frame rate. A server
started with ``--auth_token_file`` wants ``Authorization: Bearer <token>`` on every request; the client reads the
token from the environment variable ``SAGE_GRPO_REWARD_TOKEN`` (never a flag: command lines are visible to every
user of a machine through ``ps``). A URL carrying credentials (``user:password@``, a query string such as
``?token=...``) is refused at start, in a message that shows it masked (:func:`redact_secrets`): the client never
sends them, and the URL would be printed in the run summary and recorded in ``run_config.yaml`` and every checkpoint.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass

import torch

from .remote_info import InfoFieldError, ServerInfo, check_server_info

HEADER_LENGTH_BYTES = 4
MAX_HEADER_BYTES = 1 << 20
TOKEN_ENV = "SAGE_GRPO_REWARD_TOKEN"


# userinfo after a scheme (``https://user:password@``), and a query string up to a space, quote or fragment
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")
_QUERY = re.compile(r"\?[^\s#'\"]+")


def redact_secrets(text: str) -> str:
    """``text`` with every URL's ``user:password@`` and every query string masked (``***@``, ``?***``)."""
    return _QUERY.sub("?***", _USERINFO.sub(r"\g<scheme>***@", text))


class RemoteRewardError(RuntimeError):
    """The reward server could not be reached, or refused or failed a request."""


class ServerInfoError(RemoteRewardError, ValueError):
    """The server's ``GET /info`` answer is absurd (:mod:`.remote_info`) or serves another reward model or frame rate
    than the trainer's: refused at start."""


@dataclass(frozen=True)
class RemoteSettings:
    """``--remote_reward_url``, ``--remote_reward_retries``, ``--remote_reward_timeout`` (seconds)."""

    url: str
    retries: int = 3
    timeout_s: float = 600.0
    backoff_s: float = 0.5  # first wait between attempts; doubles after each
    probe_timeout_s: float = 5.0  # the one GET /info at start: a silent server ends the run in seconds

    def __post_init__(self):
        shown = redact_secrets(self.url)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"remote_reward_url {shown!r} must be an http(s) URL, e.g. http://127.0.0.1:8765")
        parts = urllib.parse.urlsplit(self.url)
        if "@" in parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"remote_reward_url {shown!r} carries credentials or a query: give the address only "
                             f"(http(s)://host:port[/path]); the server's token goes in the environment variable "
                             f"{TOKEN_ENV}, never in the URL, which is printed and recorded in run_config.yaml")
        if self.retries < 0:
            raise ValueError(f"remote_reward_retries must be >= 0, got {self.retries}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"remote_reward_timeout must be a positive number of seconds, got {self.timeout_s}")
        if not (self.probe_timeout_s > 0 and math.isfinite(self.probe_timeout_s)):
            raise ValueError(f"the probe timeout must be a positive number of seconds, got {self.probe_timeout_s}")


def encode_request(videos: torch.Tensor, prompts: list[str], video_fps: float) -> bytes:
    """``videos (B, 3, F, H, W)`` in [0, 1] + prompts -> a ``POST /score`` body."""
    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
    frames = videos.detach().float().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    frames = frames.permute(0, 2, 3, 4, 1).contiguous().cpu()  # (B, F, H, W, 3)
    header = json.dumps({"prompts": list(prompts), "shape": list(frames.shape), "dtype": "uint8",
                         "video_fps": float(video_fps)}).encode()
    return len(header).to_bytes(HEADER_LENGTH_BYTES, "big") + header + frames.numpy().tobytes()


def decode_scores(payload: bytes, metric_names: tuple[str, ...] | None, batch: int) -> dict[str, torch.Tensor]:
    """A ``/score`` response -> metric -> float32 ``(B,)`` (null -> NaN); checked against the expected shape. The
    answer is data from another process: anything but ``{"scores": {metric: [number or null] * B}}`` is one
    :class:`RemoteRewardError` naming what was wrong (those videos then fail as any failed reward does), never a
    traceback from deep in the decoding."""
    try:
        answer = json.loads(payload)
    except (ValueError, RecursionError):  # ValueError: JSON, UTF-8, an integer of 4300+ digits
        answer = None
    scores = answer.get("scores") if isinstance(answer, dict) else None
    if not isinstance(scores, dict) or not scores:
        raise RemoteRewardError(f"the reward server answered without scores: {payload[:200]!r}")
    if metric_names is not None and set(scores) != set(metric_names):
        raise RemoteRewardError(f"the reward server returned metrics {sorted(scores)[:20]}, expected "
                                f"{list(metric_names)}")
    out = {}
    for metric, values in scores.items():
        if not isinstance(values, list) or len(values) != batch:
            got = f"for {len(values)} videos" if isinstance(values, list) else f"as a JSON {type(values).__name__}"
            raise RemoteRewardError(f"the reward server returned {metric[:100]!r} {got}, sent {batch}")
        try:
            if not all(v is None or type(v) in (int, float) for v in values):
                raise TypeError
            out[metric] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
        except (TypeError, OverflowError):  # OverflowError: an integer past float's range
            raise RemoteRewardError(f"the reward server returned {metric[:100]!r} with a value that is not a number "
                                    "(nor null)") from None
    return out


class RemoteReward:
    """The reward ``reward_model`` scored by the server at ``settings.url`` (see the module docstring)."""

    def __init__(self, reward_model: str, settings: RemoteSettings, *, video_fps: float):
        self.reward_model = reward_model
        self.settings = settings
        self.video_fps = float(video_fps)
        self.url = settings.url.rstrip("/")
        token = os.environ.get(TOKEN_ENV, "").strip()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        info = self._probe()
        if info.reward_model != reward_model:
            raise ServerInfoError(f"the reward server at {self.url} serves {info.reward_model!r}, not --reward_model "
                                  f"{reward_model!r}; start it with --reward_model {reward_model}")
        if info.video_fps != self.video_fps:
            raise ServerInfoError(f"the reward server at {self.url} samples frames at --video_fps {info.video_fps}, "
                                  f"the trainer's videos have {self.video_fps}; start it with --video_fps "
                                  f"{self.video_fps}")
        self.metric_names = info.metric_names
        self.max_request_bytes = info.max_request_bytes
        self.max_videos = info.max_videos_per_request

    def _probe(self) -> ServerInfo:
        """One ``GET /info`` with the short probe timeout; every failure is one line naming the URL and the fix."""
        timeout = min(self.settings.probe_timeout_s, self.settings.timeout_s)
        request = urllib.request.Request(self.url + "/info", headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                info = json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 401:
                said = "refused the token in" if self._headers else "requires a token; set"
                raise RemoteRewardError(f"the reward server at {self.url} {said} {TOKEN_ENV}: set it to the "
                                        "contents of the server's --auth_token_file") from None
            raise RemoteRewardError(f"the reward server at {self.url} answered GET /info with HTTP {err.code} "
                                    f"({_error_text(err)}); check that --remote_reward_url points at "
                                    "scripts/reward_server.py") from None
        except (OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            raise RemoteRewardError(
                f"the reward server at {self.url} did not answer GET /info within {timeout:g} s "
                f"({type(reason).__name__}: {reason}); check that it runs there (Start the server first: "
                f"python scripts/reward_server.py --reward_model {self.reward_model} --port <port>), that host and "
                "port are right and reachable from this machine (a server for other machines needs --host "
                "0.0.0.0)") from None
        except (ValueError, RecursionError):
            raise RemoteRewardError(f"{self.url}/info did not answer with JSON: is --remote_reward_url the reward "
                                    "server's address?") from None
        try:
            return check_server_info(info)
        except InfoFieldError as err:
            raise ServerInfoError(f"the reward server at {self.url} answered GET /info, but {err}; is "
                                  "--remote_reward_url the address of scripts/reward_server.py?") from None

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        if len(prompts) != videos.shape[0]:
            raise ValueError(f"{videos.shape[0]} videos but {len(prompts)} prompts")
        bytes_per_video = 3 * math.prod(videos.shape[2:])
        per_request = max(1, min(self.max_videos, (self.max_request_bytes - MAX_HEADER_BYTES) // bytes_per_video))
        parts = [self._score(videos[i:i + per_request], prompts[i:i + per_request])
                 for i in range(0, len(prompts), per_request)]
        return {metric: torch.cat([part[metric] for part in parts]) for metric in parts[0]}

    def _score(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        body = encode_request(videos, prompts, self.video_fps)
        try:
            return decode_scores(self._request("POST", "/score", body), self.metric_names, len(prompts))
        except RemoteRewardError as err:
            if self.metric_names is None:  # no names to fill: the composite's failure policy takes the error
                raise
            warnings.warn(f"remote reward {self.reward_model!r} failed on {len(prompts)} videos; they score NaN: "
                          f"{err}", RuntimeWarning, stacklevel=2)
            return {metric: torch.full((len(prompts),), math.nan) for metric in self.metric_names}

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        """One request with the retry policy: connection errors, timeouts and 5xx are retried, 4xx are not."""
        settings = self.settings
        headers = dict(self._headers, **({"Content-Type": "application/octet-stream"} if body is not None else {}))
        last = ""
        for attempt in range(settings.retries + 1):
            if attempt:
                time.sleep(settings.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=settings.timeout_s) as response:
                    return response.read()
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}: {_error_text(err)}"
                if err.code < 500:
                    raise RemoteRewardError(f"the reward server at {self.url} refused {method} {path}: "
                                            f"{last}") from None
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, garbled
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise RemoteRewardError(f"the reward server at {self.url} failed {method} {path} "
                                f"{settings.retries + 1} times; last: {last}")


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read()).get("error", ""))[:500]
    except (ValueError, OSError, AttributeError):
        return err.reason

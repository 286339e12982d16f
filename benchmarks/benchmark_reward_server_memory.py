"""Peak memory of one ``POST /score`` on the reward server, against the request's body size.

    python benchmarks/benchmark_reward_server_memory.py [--body_mb 64] [--videos 4] [--cases float,uint8,...]

A real server (``sage_grpo.rewards.serving``) on 127.0.0.1 in a thread of a fresh process per case, a warm-up
request, then one request of ``--videos`` videos of 16 frames, 512 pixels high, as wide as makes ``--body_mb`` MiB of
uint8 frames. Two measurements of that request, each divided by the body's size:

* the rise of the process's peak resident set (``VmHWM`` after ``/proc/self/clear_refs``, Linux): every allocation,
  torch's included. Each case's process fixes glibc's mmap threshold at 64 KiB first (:func:`exact_resident_set`):
  every buffer of that size or more is its own mapping, returned when freed, so the peak is the peak of live memory
  rather than of what the allocator kept after earlier frees (with glibc's moving threshold, the VideoAlign case read
  from 1.6x to 2.6x between runs);
* the peak of ``tracemalloc`` (Python's allocators: the body's buffer, any bytes copy of it; torch's allocator is
  not traced).

Cases (the reward allocates next to nothing itself, so the numbers are the server's):

* ``float``: a reward that takes float frames in [0, 1], the whole request as one chunk (``--reward_batch_size`` >=
  the videos of a request, as a trainer's requests are): the body plus the request in float32;
* ``float_chunked``: the same, one video per chunk: the body plus one video in float32;
* ``uint8``: the same reward declaring ``accepts_uint8`` (:mod:`sage_grpo.rewards.base`): it reads the body's frames;
* ``videoalign``: VideoAlign (the real class, on the tiny random-weight checkpoint), the whole request as one chunk.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import subprocess
import sys
import tempfile
import threading
import tracemalloc
import urllib.request
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.rewards.remote import HEADER_LENGTH_BYTES  # noqa: E402
from sage_grpo.rewards.serving import RewardService, make_server  # noqa: E402

CASES = ("float", "float_chunked", "uint8", "videoalign")
FRAMES, HEIGHT = 16, 512
VIDEO_FPS = 24.0


class LevelReward:
    """Each video's brightest pixel in [0, 1]: reads every frame, allocates only its output."""

    metric_names = ("level",)

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        level = videos.amax(dim=(1, 2, 3, 4)).float()
        return {"level": level if videos.is_floating_point() else level / 255.0}


class Uint8LevelReward(LevelReward):
    accepts_uint8 = True


class Measurement(NamedTuple):  # a NamedTuple: tests load this file without registering it as a module
    body_bytes: int
    resident_rise: int  # bytes
    traced_peak: int  # bytes
    scores: dict

    def line(self, case: str) -> str:
        mib = 1 << 20
        return (f"{case}: body {self.body_bytes / mib:.2f} MiB, peak resident +{self.resident_rise / mib:.1f} MiB "
                f"({self.resident_rise / self.body_bytes:.2f}x), tracemalloc peak {self.traced_peak / mib:.1f} MiB "
                f"({self.traced_peak / self.body_bytes:.2f}x)")


def score_body(videos: int, frames: int, height: int, width: int) -> bytes:
    """A ``/score`` body whose video i is all gray level 30 * i (so its scores are known)."""
    shape = [videos, frames, height, width, 3]
    header = json.dumps({"prompts": ["p"] * videos, "shape": shape, "dtype": "uint8",
                         "video_fps": VIDEO_FPS}).encode()
    body = bytearray(len(header).to_bytes(HEADER_LENGTH_BYTES, "big") + header)
    per_video = frames * height * width * 3
    for i in range(videos):
        body += bytes([(30 * i) % 256]) * per_video
    return bytes(body)


def resident_bytes() -> tuple[int, int]:
    """(current, peak) resident set of this process, from /proc (Linux)."""
    status = Path("/proc/self/status").read_text()
    return tuple(int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) << 10 for key in ("VmRSS", "VmHWM"))


M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
EXACT_THRESHOLD_BYTES = 64 << 10


def exact_resident_set() -> bool:
    """Fix glibc's mmap threshold at 64 KiB for this process: each allocation of that size or more gets its own
    mapping and gives it back when freed, so the resident set follows live memory (glibc otherwise raises the
    threshold after each freed mapping and keeps later buffers of that size in its arenas after they are freed).
    False where the C library has no ``mallopt`` or refuses it (the numbers then include allocator caching)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, EXACT_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _post(url: str, body: bytes) -> dict:
    request = urllib.request.Request(url + "/score", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["scores"]


def measure(service: RewardService, body: bytes, warmup: bytes | None = None) -> Measurement:
    """One request of ``body`` to a server of ``service`` in a thread of this process (after ``warmup``, if given)."""
    server = make_server(service, "127.0.0.1", 0)
    url = "http://%s:%d" % server.server_address[:2]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        if warmup is not None:
            _post(url, warmup)
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        before, _ = resident_bytes()
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the current resident set
        scores = _post(url, body)
        _, peak = resident_bytes()
        traced = tracemalloc.get_traced_memory()[1]
        if started:
            tracemalloc.stop()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return Measurement(len(body), peak - before, traced, scores)


def _service(case: str, tmp: Path) -> RewardService:
    if case == "videoalign":
        from sage_grpo.rewards.tiny import write_tiny_video_reward
        from sage_grpo.rewards.videoalign import VideoAlignReward

        write_tiny_video_reward(tmp, seed=0, key_layout="legacy")
        reward = VideoAlignReward(tmp, device="cpu", dtype=torch.float32, video_fps=VIDEO_FPS)
        return RewardService(reward, "videoalign_local", video_fps=VIDEO_FPS)
    reward = Uint8LevelReward() if case == "uint8" else LevelReward()
    return RewardService(reward, "level", video_fps=VIDEO_FPS, batch_size=1 if case == "float_chunked" else None)


def run_case(case: str, body_mb: float, videos: int) -> Measurement:
    width = max(1, round(body_mb * (1 << 20) / (videos * FRAMES * HEIGHT * 3)))
    body = score_body(videos, FRAMES, HEIGHT, width)
    with tempfile.TemporaryDirectory(prefix="reward_server_memory_") as tmp:
        service = _service(case, Path(tmp))
        return measure(service, body, warmup=score_body(1, FRAMES, 64, 64))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body_mb", type=float, default=64.0)
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process
    args = parser.parse_args(argv)
    if args.case:
        if not exact_resident_set():
            print("note: glibc's mmap threshold could not be fixed; the resident peak includes allocator caching")
        torch.set_num_threads(1)
        measured = run_case(args.case, args.body_mb, args.videos)
        print(measured.line(args.case), flush=True)
        for name, values in measured.scores.items():  # what the reward read (video i is gray level 30 * i)
            print(f"  {name}: " + " ".join(f"{float(v):.4f}" for v in values), flush=True)
        return
    for case in args.cases.split(","):
        if case not in CASES:
            raise SystemExit(f"--cases: unknown case {case!r}; choose from {','.join(CASES)}")
        subprocess.run([sys.executable, __file__, "--case", case, "--body_mb", str(args.body_mb),
                        "--videos", str(args.videos)], check=True)


if __name__ == "__main__":
    main()

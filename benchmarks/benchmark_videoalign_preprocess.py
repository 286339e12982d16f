"""Time VideoAlign's frame preprocessing before and after picking the sampled frames first.

    python benchmarks/benchmark_videoalign_preprocess.py [--repeats 5] [--threads 2]

Input: a random 81x352x624 uint8 video (a 480p rollout), as a decoded file gives it ``(F, H, W, 3)`` and as the
trainer gives it (float in [0, 1], ``(3, F, H, W)``). The budget is the released checkpoint's (2 fps -> 6 frames,
``max_frame_pixels`` 200704 -> 336x588).

* old: the preprocessing before the change, kept here as the reference: the whole video is converted to float
  (and, for tensors, clamped and scaled to [0, 255]) at full size, then the sampled frames are picked and resized;
* new: ``FrameSampler`` picks the sampled frames first and converts and resizes only those.

Both give identical frames (checked here and in tests/unit/test_rewards.py); the script prints both times and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.rewards.video_preprocess import VIDEO_MIN_PIXELS, num_sampled_frames, sample_frame_indices  # noqa: E402
from sage_grpo.rewards.videoalign_inputs import FrameSampler, VideoInputSpec  # noqa: E402

RELEASED_SPEC = VideoInputSpec(fps=2.0, max_pixels=200704, min_pixels=VIDEO_MIN_PIXELS)
VIDEO_SHAPE = (81, 352, 624)  # (F, H, W)
VIDEO_FPS = 24.0


def _reference_prepare(sampler: FrameSampler, frames: torch.Tensor, video_fps: float, quantize: bool) -> torch.Tensor:
    total = frames.shape[0]
    count = num_sampled_frames(total, video_fps, fps=sampler.spec.fps, nframes=sampler.spec.num_frames)
    return sampler.resize(frames[sample_frame_indices(total, count)], quantize=quantize)


def reference_frames_from_tensor(sampler: FrameSampler, video: torch.Tensor, video_fps: float) -> torch.Tensor:
    """The old path for a decoded rollout ``(3, F, H, W)`` in [0, 1]: every frame scaled to [0, 255] first."""
    frames = video.detach().float().clamp(0.0, 1.0).permute(1, 0, 2, 3) * 255.0
    return _reference_prepare(sampler, frames, video_fps, quantize=False)


def reference_frames_from_uint8(sampler: FrameSampler, frames: torch.Tensor, video_fps: float) -> torch.Tensor:
    """The old path for decoded file frames ``(F, H, W, 3)`` uint8: every frame converted to float first."""
    return _reference_prepare(sampler, frames.permute(0, 3, 1, 2).float(), video_fps, quantize=True)


def _seconds(fn, repeats: int) -> float:
    fn()  # warm-up (allocator, kernels)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per path; the best is reported")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    sampler = FrameSampler(RELEASED_SPEC)
    frames_uint8 = torch.randint(0, 256, (*VIDEO_SHAPE, 3), dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(0))  # (F, H, W, 3)
    video = frames_uint8.permute(3, 0, 1, 2).float() / 255.0  # (3, F, H, W) in [0, 1]
    cases = {
        "uint8 (F, H, W, 3)": (reference_frames_from_uint8, FrameSampler.frames_from_uint8, frames_uint8),
        "float (3, F, H, W)": (reference_frames_from_tensor, FrameSampler.frames_from_tensor, video),
    }
    print(f"video {VIDEO_SHAPE[0]}x{VIDEO_SHAPE[1]}x{VIDEO_SHAPE[2]}, {args.threads} CPU threads, best of "
          f"{args.repeats}; sampled frames {sampler.frame_indices(VIDEO_SHAPE[0], VIDEO_FPS)}")
    for name, (old, new, data) in cases.items():
        if not torch.equal(old(sampler, data, VIDEO_FPS), new(sampler, data, VIDEO_FPS)):
            raise SystemExit(f"{name}: the new path's frames differ from the old path's")
        old_s = _seconds(lambda: old(sampler, data, VIDEO_FPS), args.repeats)
        new_s = _seconds(lambda: new(sampler, data, VIDEO_FPS), args.repeats)
        print(f"{name}: old {old_s * 1e3:.1f} ms, new {new_s * 1e3:.1f} ms, {old_s / new_s:.1f}x faster "
              "(identical frames)")


if __name__ == "__main__":
    main()

"""Writing and reading mp4 videos (imageio + its bundled ffmpeg), file-name-safe prompt strings, and a background
writer that takes media writing off the training thread."""

import os
import re
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch

# imageio-ffmpeg starts ffmpeg with ``preexec_fn=os.setpgrp`` (so a Ctrl-C reaches Python first), which runs Python in
# the forked child: in a process with other threads (the background writer below, the reward worker, gloo's) the child
# can block forever on a lock another thread held at the fork, and the writer with it (seen once in a dp 2 test run:
# the fork child stuck before exec). Its own switch turns the preexec off; ffmpeg then shares the run's process group
# and a Ctrl-C stops it with the run.
os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")


def video_to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) float in [0, 1] -> (F, H, W, 3) uint8 (clamp, scale by 255, truncate, as the reference)."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"expected a video of shape (3, F, H, W), got {tuple(video.shape)}")
    frames = (video.detach().float().clamp(0, 1) * 255).to(torch.uint8)
    return frames.permute(1, 2, 3, 0).cpu().numpy()


def write_video(path: Union[str, Path], video: torch.Tensor, fps: float = 24.0) -> Path:
    """Write a (3, F, H, W) video in [0, 1] as mp4 the way the reference saves rollouts (``save_videos_grid``):
    uint8 truncation, then ``imageio.mimsave`` with imageio-ffmpeg's defaults (libx264, yuv420p, quality 5); the
    frame size is kept as it is (imageio would otherwise resize sides that are not multiples of 16)."""
    import imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, list(video_to_uint8_frames(video)), fps=fps, macro_block_size=1)
    return path


def read_video_frames(path: Union[str, Path]) -> Tuple[torch.Tensor, float]:
    """Decode a video file into ``(uint8 frames (F, H, W, 3), fps)`` with imageio-ffmpeg."""
    import imageio

    with imageio.get_reader(str(path), format="FFMPEG") as reader:
        fps = float(reader.get_meta_data()["fps"])
        frames = np.stack([np.asarray(frame) for frame in reader])
    return torch.from_numpy(frames), fps


def read_video(path: Union[str, Path]) -> torch.Tensor:
    """Read an mp4 into (3, F, H, W) float in [0, 1]."""
    frames, _ = read_video_frames(path)
    return frames.permute(3, 0, 1, 2).float() / 255.0


def sanitize_name(text: str, max_length: int = 50) -> str:
    """Prompt -> file-name fragment as the reference: whitespace collapsed, only [A-Za-z0-9 _.-] kept, at most
    ``max_length`` characters."""
    collapsed = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"[^A-Za-z0-9 _.-]", "", collapsed)[:max_length].strip()


def mp4_to_gif(path: Union[str, Path], fps: float) -> bytes:
    """An mp4 as an animated GIF (every frame, looping), for trackers that show only GIFs (SwanLab)."""
    import io

    import imageio

    frames, _ = read_video_frames(path)
    buffer = io.BytesIO()
    imageio.mimsave(buffer, list(frames.numpy()), format="GIF", duration=1000.0 / fps, loop=0)
    return buffer.getvalue()


class BackgroundWriter:
    """Media files written off the training thread: one worker thread runs the submitted jobs in order from a
    bounded queue (``max_pending`` jobs; a full queue makes ``submit`` wait, so memory stays bounded when the disk is
    slower than training).

    A job's return value (e.g. the videos it wrote, for the trackers) is handed back by :meth:`completed` on the
    caller's thread, so trackers are only ever called from the training thread. A job that raised makes the next
    ``submit``, ``completed`` or ``flush`` raise (the first error; the worker keeps going with later jobs).
    ``flush`` waits for every job submitted so far (the trainer calls it before a checkpoint and at the end), and
    ``seconds`` adds up the worker's busy time."""

    def __init__(self, max_pending: int = 2):
        import queue
        import threading

        self._jobs: "queue.Queue" = queue.Queue(maxsize=max_pending)
        self._done: list = []
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._work, name="media-writer", daemon=True)
        self._thread.start()
        import atexit

        atexit.register(self._drain)  # a run that stops on an error still gets the media it had submitted

    def _drain(self) -> None:
        if self._thread.is_alive():
            self._jobs.join()

    def _work(self) -> None:
        import time

        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                start = time.perf_counter()
                result = job()
                with self._lock:
                    self._done.append(result)
                    self.seconds += time.perf_counter() - start
            except BaseException as error:  # handed to the training thread, which raises it
                with self._lock:
                    self._error = self._error or error
            finally:
                self._jobs.task_done()

    def _raise_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"writing rollout media failed: {error}") from error

    def submit(self, job: Callable[[], Any]) -> None:
        self._raise_error()
        if not self._thread.is_alive():
            raise RuntimeError("the media writer was closed")
        self._jobs.put(job)

    def completed(self) -> List[Any]:
        """Results of the jobs finished since the last call, in submission order."""
        self._raise_error()
        with self._lock:
            done, self._done = self._done, []
        return done

    def flush(self) -> List[Any]:
        """Wait for every submitted job; returns the results not handed out yet."""
        self._jobs.join()
        return self.completed()

    def close(self) -> List[Any]:
        if not self._thread.is_alive():
            return self.completed()
        done = self.flush()
        self._jobs.put(None)
        self._thread.join()
        return done

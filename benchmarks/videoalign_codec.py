"""How far the mp4 round trip moves VideoAlign scores: the tensor path (decoded rollouts scored directly, our default)
against the reference's path (each video written to mp4 with ``imageio.mimsave``'s defaults and the decoded file
scored), on the tiny random-weight VideoReward (``sage_grpo/rewards/tiny.py``).

    python benchmarks/videoalign_codec.py [--seeds 0 1 2 3] [--sizes 64x96 16x16 128x224]

Videos: per seed and size, three moving colour gradients in [0.1, 0.9] (codec friendly: what a decoded rollout looks
like) and, as the codec's worst case, one of uniform per-pixel noise; 9 frames at 24 fps. Printed per kind: the largest
|score difference| per head (normalised scores, as the trainer sees them) and for Overall, and the spread of the
tensor-path Overall over the same videos (what the content moves). The figure in ``sage_grpo/rewards/videoalign.py``'s
docstring is this script's output.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.rewards.tiny import gradient_videos, write_tiny_video_reward  # noqa: E402
from sage_grpo.rewards.videoalign import HEADS, VideoAlignReward  # noqa: E402
from sage_grpo.video_io import write_video  # noqa: E402

PROMPTS = ["A cat walks on the grass.", "A red ball bounces on a wooden floor.", "The camera pans over a city."]


def noise_videos(count: int, height: int, width: int, seed: int, frames: int = 9) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.rand(count, 3, frames, height, width, generator=gen)


def differences(reward: VideoAlignReward, videos: torch.Tensor, folder: Path) -> tuple[dict, torch.Tensor]:
    """(per key max |tensor - mp4|, tensor-path Overall) for ``videos``."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(videos))]
    direct = reward(videos, prompts)
    paths = [write_video(folder / f"{i}.mp4", video, fps=24) for i, video in enumerate(videos)]
    by_file = reward.score_files(paths, prompts)
    return {key: (direct[key] - by_file[key]).abs().max().item() for key in (*HEADS, "Overall")}, direct["Overall"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--sizes", nargs="+", default=["64x96", "16x16", "128x224"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tiny_video_reward(root / "ckpts")
        reward = VideoAlignReward(root / "ckpts", device="cpu", dtype=torch.float32)
        for kind, make, count in (("gradients", lambda n, h, w, s: gradient_videos(n, 9, h, w, s), 3),
                                  ("noise", noise_videos, 1)):
            worst = {key: 0.0 for key in (*HEADS, "Overall")}
            overall = []
            for size in args.sizes:
                height, width = (int(v) for v in size.split("x"))
                for seed in args.seeds:
                    folder = root / f"{kind}_{size}_{seed}"
                    folder.mkdir()
                    diff, direct = differences(reward, make(count, height, width, seed), folder)
                    worst = {key: max(worst[key], diff[key]) for key in worst}
                    overall.append(direct)
            spread = torch.cat(overall)
            print(f"{kind} ({count} per seed x {len(args.seeds)} seeds x sizes {args.sizes}): max |tensor - mp4| "
                  + ", ".join(f"{key} {value:.2e}" for key, value in worst.items())
                  + f"; tensor-path Overall spans {spread.min().item():.4f} .. {spread.max().item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

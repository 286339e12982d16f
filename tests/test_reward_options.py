"""Reward options (issue 15 item 5, issue 13 item 6): VideoAlign sampling overrides, frame picking before any
full-size work, reward aggregation at the advantage level, and the remote reward server and client."""

import importlib.util
from pathlib import Path

import pytest
import torch

from sage_grpo.rewards.tiny import write_tiny_video_reward
from sage_grpo.rewards.videoalign import VideoAlignReward
from sage_grpo.rewards.videoalign_inputs import FrameSampler

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["A cat walks on the grass.", "The camera pans over a city at night."]


def _benchmark_script():
    """scripts/benchmark_videoalign_preprocess.py, which keeps the old preprocessing path as the reference."""
    path = REPO_ROOT / "scripts" / "benchmark_videoalign_preprocess.py"
    spec = importlib.util.spec_from_file_location("benchmark_videoalign_preprocess", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_videos(batch: int = 2, frames: int = 9, height: int = 64, width: int = 96, seed: int = 0):
    """(B, 3, F, H, W) on the 8-bit grid (k / 255), so a uint8 round trip is exact."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, frames, height, width), generator=gen).float() / 255.0


@pytest.fixture(scope="module")
def reward_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reward_options")
    write_tiny_video_reward(root, seed=0, key_layout="legacy")
    return root


@pytest.fixture(scope="module")
def videoalign(reward_root) -> VideoAlignReward:
    return VideoAlignReward(reward_root, device="cpu", dtype=torch.float32)


# ------------------------------------------------------------------ frames picked before any full-size work


@pytest.mark.parametrize("spec_name", ["tiny", "released"])
def test_picking_frames_first_gives_the_old_paths_frames_bit_for_bit(videoalign, spec_name):
    bench = _benchmark_script()
    sampler = videoalign.inputs if spec_name == "tiny" else FrameSampler(bench.RELEASED_SPEC)
    gen = torch.Generator().manual_seed(1)
    # 33 frames at 24 fps -> 4 sampled of 33; values outside [0, 1] exercise the clamp; bf16 the dtype conversion.
    video = torch.rand(3, 33, 72, 100, generator=gen) * 1.2 - 0.1
    for tensor in (video, video.bfloat16()):
        old = bench.reference_frames_from_tensor(sampler, tensor, 24.0)
        new = sampler.frames_from_tensor(tensor, 24.0)
        assert new.shape[0] == 4 and torch.equal(old, new)
    frames_uint8 = torch.randint(0, 256, (33, 72, 100, 3), dtype=torch.uint8, generator=gen)
    old = bench.reference_frames_from_uint8(sampler, frames_uint8, 24.0)
    new = sampler.frames_from_uint8(frames_uint8, 24.0)
    assert torch.equal(old, new) and torch.equal(new, new.round())  # file frames stay on uint8 levels
    if spec_name == "tiny":  # the pixel values the model sees are the same tensors
        assert torch.equal(videoalign.inputs.patchify(old)[0], videoalign.inputs.patchify(new)[0])

"""Helpers shared by unit/test_reward_options.py and e2e/test_reward_options_runs.py."""
import threading
from pathlib import Path

import torch

from sage_grpo.rewards.remote import RemoteSettings
from sage_grpo.rewards.serving import RewardService, make_server

from procs import scaled


REPO_ROOT = Path(__file__).resolve().parents[1]


def random_videos(batch: int = 2, frames: int = 9, height: int = 64, width: int = 96, seed: int = 0):
    """(B, 3, F, H, W) on the 8-bit grid (k / 255), so a uint8 round trip is exact."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, frames, height, width), generator=gen).float() / 255.0


class ServerThread:
    """A reward server on 127.0.0.1 at a free port, in a thread of this process."""

    def __init__(self, service: RewardService):
        self.service = service
        self.server = make_server(service, "127.0.0.1", 0)
        self.address = self.server.server_address[:2]
        self.url = "http://%s:%d" % self.address
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def fast_remote(url: str, retries: int = 3) -> RemoteSettings:
    return RemoteSettings(url, retries=retries, timeout_s=scaled(5.0), backoff_s=0.01)

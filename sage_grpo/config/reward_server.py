"""``RewardServerConfig``: the options of ``scripts/reward_server.py``, declared once.

The reward options carry the trainer's names and defaults (``--reward_model``, ``--reward_kwargs``,
``--pretrained_model_root``, ``--reward_checkpoint_mode``, ``--video_fps``, ``--reward_batch_size``,
``--reward_from_mp4``, ``--videoalign_*``), so a trainer's reward flags start the server unchanged; the rest say
where it listens and how much one request may carry.
"""

from dataclasses import dataclass
from typing import Optional

from sage_grpo.config.schema import config_field

# the largest values a server may announce in GET /info (its clients refuse larger ones as absurd)
MAX_VIDEO_FPS = 1000
MAX_REQUEST_MB = 1 << 20  # 1 TiB
MAX_VIDEOS_PER_REQUEST = 1 << 16


@dataclass
class RewardServerConfig:
    HELP_GROUPS = (  # --help's topic groups, in order; each option names its own (group=...)
        ("reward", "the reward served (the trainer's reward flags)"),
        ("server", "where it listens, who may call it and how much a request may carry"),
    )
    host: str = config_field(
        "127.0.0.1", "Address to listen on (0.0.0.0: every interface; then also pass --auth_token_file)",
        group="server")
    port: int = config_field(8765, "Port to listen on (0: a free one, printed at start)", group="server")
    reward_model: str = config_field(
        "videoalign_local", "Reward model served: videoalign_local, a built-in toy reward, or a dotted path "
        "'package.module:callable' (as the trainer's --reward_model)", group="reward")
    reward_kwargs: str = config_field("{}", "JSON constructor arguments of the reward model", group="reward")
    pretrained_model_root: str = config_field("ckpts", "Root holding VideoReward/ (the trainer's flag)", group="reward")
    reward_checkpoint_mode: str = config_field(
        "v3", "Key-remapping mode for the VideoReward state dict", choices=("v1", "v2", "v3"), group="reward")
    dtype: str = config_field("bf16", "Dtype the reward model runs in", choices=("bf16", "fp32"), group="reward")
    device: Optional[str] = config_field(None, "Device (default: cuda when available, else cpu)", group="reward")
    video_fps: int = config_field(
        24, "Frame rate of the videos sent (must equal the trainer's --video_fps)", group="reward")
    reward_batch_size: int = config_field(4, "Videos per reward-model forward", group="reward")
    reward_from_mp4: bool = config_field(
        False, "Score each video after an mp4 round trip (reference parity)", group="reward")
    videoalign_fps: Optional[float] = config_field(
        None, "VideoAlign frame rate (default: the checkpoint's)", group="reward")
    videoalign_num_frames: Optional[int] = config_field(
        None, "VideoAlign fixed frame count; excludes --videoalign_fps (default: the checkpoint's)", group="reward")
    videoalign_max_pixels: Optional[int] = config_field(
        None, "VideoAlign pixel budget per frame (default: the checkpoint's)", group="reward")
    max_request_mb: int = config_field(1024, "Largest request body accepted, in MiB (413 above)", group="server")
    max_videos_per_request: int = config_field(64, "Most videos one request may hold", group="server")
    max_buffered_mb: int = config_field(
        2048, "Request bodies held in memory at once over all connections, in MiB (503 above; the client retries)",
        group="server")
    max_connections: int = config_field(
        16, "Authenticated requests served at once (the next one gets 503 and is closed; the client retries)",
        group="server")
    header_timeout_s: float = config_field(
        1.0, "Seconds a new connection has to send its request line and headers, token included (then it is closed)",
        group="server")
    idle_timeout_s: float = config_field(
        30.0, "Seconds a connection may stay silent while sending its request", group="server")
    request_timeout_s: float = config_field(
        300.0, "Seconds a connection may take to send one whole request", group="server")
    auth_token_file: Optional[str] = config_field(
        None, "File holding a shared secret (one line, >= 16 characters); every request must then send it, the "
        "trainer from the SAGE_GRPO_REWARD_TOKEN environment variable (default: no authentication)", group="server")

    def __post_init__(self):
        for name in ("max_request_mb", "max_videos_per_request", "max_buffered_mb", "max_connections",
                     "reward_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name, limit in (("video_fps", MAX_VIDEO_FPS), ("max_request_mb", MAX_REQUEST_MB),
                            ("max_videos_per_request", MAX_VIDEOS_PER_REQUEST)):
            if not 0 < getattr(self, name) <= limit:
                raise ValueError(f"--{name} must be in [1, {limit}], got {getattr(self, name)}")
        for name in ("header_timeout_s", "idle_timeout_s", "request_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"--{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.max_buffered_mb < self.max_request_mb:
            raise ValueError(f"--max_buffered_mb {self.max_buffered_mb} must be >= --max_request_mb "
                             f"{self.max_request_mb}, or no request of the largest size could ever be read")

"""Rollout media: each SP leader's rollout videos and per-group reward JSON under ``rl_samples/``, and the videos
handed to the trackers (``--save_rollout_videos``).

Samples are numbered across a prompt group's ranks: when a group spans several DP ranks each rank writes its share,
``..._group_{g}_dp_{d}_rewards.json``.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import torch

from sage_grpo.config.train.rollout import DataConfig
from sage_grpo.data import PromptItem
from sage_grpo.distributed import ParallelDims
from sage_grpo.tracking.run_dir import MetricsLogger, prune_rollout_media
from sage_grpo.tracking.trackers import ROLLOUT_VIDEOS, LoggedVideo
from sage_grpo.video_io import BackgroundWriter, write_video


@dataclass
class RolloutSamples:
    """One step's samples on this rank: prompts, seeds, (B, 3, F, H, W) videos, (B,) rewards and advantages."""

    items: List[PromptItem]
    seeds: List[int]
    videos: torch.Tensor
    rewards: Dict[str, torch.Tensor]
    advantages: torch.Tensor


@dataclass(frozen=True)
class RolloutMedia:
    data: DataConfig  # the configuration's data section: --batch_size, --num_generations
    video_fps: int  # --video_fps of the written videos
    keep_rollout_steps: int  # --keep_rollout_steps: the newest steps' media kept
    dims: ParallelDims
    ranks_per_group: int  # DP ranks one prompt group spans
    logger: MetricsLogger
    writer: BackgroundWriter  # the files are written off the training thread, one step after the other

    def write(self, run_dir: Path, update_steps: int, log_step: int, samples: RolloutSamples) -> None:
        """Write this rank's samples under ``rl_samples/{update_steps}`` in the background; their videos go to the
        trackers at ``log_step`` (the step these metrics are logged at) once written. Called by SP leaders only."""
        self._log(self.writer.completed())
        self.writer.submit(lambda: (log_step, self.write_files(run_dir, update_steps, samples)))

    def flush(self) -> None:
        """Wait for every submitted step's files (before a checkpoint and at the end) and log their videos."""
        self._log(self.writer.flush())

    def _log(self, finished) -> None:
        # the trackers are called from the training thread only
        for log_step, logged in finished:
            self.logger.log_videos(ROLLOUT_VIDEOS, logged, log_step)

    def write_files(self, run_dir: Path, update_steps: int, samples: RolloutSamples) -> List[LoggedVideo]:
        """The files of :meth:`write` (and the pruning of old steps); returns the videos for the trackers."""
        data, dp_rank, items, seeds = self.data, self.dims.dp_rank, samples.items, samples.seeds
        step_dir = run_dir / "rl_samples" / f"{update_steps:07d}"
        spread = self.ranks_per_group > 1
        group = data.batch_size if spread else data.num_generations  # members of one group on this rank
        groups_per_rank = max(data.batch_size // data.num_generations, 1)
        # position of this rank's first member in its group (samples are numbered across the group's ranks)
        offset = (dp_rank % self.ranks_per_group) * data.batch_size
        logged: List[LoggedVideo] = []
        for first in range(0, len(items), group):
            group_index = (dp_rank // self.ranks_per_group if spread
                           else dp_rank * groups_per_rank + first // group)
            group_dir = step_dir / f"group_{group_index}"
            group_dir.mkdir(parents=True, exist_ok=True)
            records = []
            for slot in range(first, min(first + group, len(items))):
                item = items[slot]
                name = (f"index_{item.index}_seed_{seeds[slot]}_dp_{dp_rank}_rank_{self.dims.rank}"
                        f"_sample_{offset + slot - first}_slot_{slot}.mp4")
                write_video(group_dir / name, samples.videos[slot], self.video_fps)
                record = {"prompt": item.prompt, "seed": seeds[slot], "video_path": str(group_dir / name),
                          "sample_idx": slot, "ranks_per_group": self.ranks_per_group,
                          "advantage": float(samples.advantages[slot])}
                if item.ref_image_path:
                    record["ref_image_path"] = item.ref_image_path
                record.update({k: float(v[slot]) for k, v in samples.rewards.items()})
                records.append(record)
                logged.append(LoggedVideo(group_dir / name, f"{item.prompt} (seed {seeds[slot]}, reward "
                                          f"{record['avg']:.4f}, advantage {record['advantage']:+.3f})",
                                          self.video_fps))
            share = f"_dp_{dp_rank}" if spread else ""
            path = group_dir / f"index_{items[first].index}_group_{group_index}{share}_rewards.json"
            path.write_text(json.dumps(records, indent=2))
        if self.dims.is_main:
            prune_rollout_media(run_dir, self.keep_rollout_steps)
        return logged

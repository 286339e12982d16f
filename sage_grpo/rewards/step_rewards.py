"""A GRPO step's rewards: scored on the SP leader, in line or in a background worker (``--async_reward``), then shared.

The reference means (the KL reference's SDE means on the stored transitions) never need the rewards, and the
advantages need nothing else, so the trainer starts the scoring (:meth:`StepRewards.start`) as soon as the videos are
decoded, computes the reference means, and only then collects the rewards (:meth:`StepRewards.collect`) for the
advantages. In line (``async_reward`` false) :meth:`~StepRewards.start` scores at once and the step is the reference's
sequence; in the background one worker thread scores while the training thread runs the reference pass: a remote
reward server (``--remote_reward_url``) then costs the step only the wait beyond the reference pass, a local reward
the contention for the device (on a GPU the worker scores on a CUDA stream of its own; on the CPU it competes for
the cores with the trainer's threads, so it pays where a core is free: ``docs/benchmarks.md``).

Either way the rewards are the same numbers: the reward sees the same videos and prompts, nothing the reference pass
does touches them (it draws no random numbers), and a failure is what it was: NaN scores count as failed samples
(``--max_failed_reward_steps``), and an exception the reward raises is raised on the training thread, at
:meth:`~StepRewards.collect` instead of at :meth:`~StepRewards.start`. The collectives (sharing the SP leader's
rewards, gathering a prompt group spread over DP ranks) run in :meth:`~StepRewards.collect`, on the training thread,
in the same order on every rank.
"""

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

import torch

from sage_grpo.distributed.parallel_dims import ParallelDims
from sage_grpo.distributed.rollout_sync import gather_group_rewards, share_rewards

Rewards = Dict[str, torch.Tensor]


def score_videos(reward_fn: Callable, videos: torch.Tensor, prompts: List[str]) -> Rewards:
    """``reward_fn``'s {name: (B,) float32 CPU tensor} for the videos, without gradients; it must give ``avg``."""
    with torch.no_grad():
        scored = reward_fn(videos, list(prompts))
    if "avg" not in scored:
        raise KeyError(f"the reward function returned {sorted(scored)} without the 'avg' key GRPO trains on")
    return {name: value.detach().float().cpu() for name, value in scored.items()}


class StepRewards:
    """Scores a step's videos with ``reward_fn`` on the SP leader (None elsewhere), in a background worker when
    ``background``; ``seconds`` is the worker's own time on the last step's videos (it overlaps the step's phases;
    0 in line)."""

    def __init__(self, reward_fn: Optional[Callable], dims: ParallelDims, ranks_per_group: int,
                 device: torch.device, background: bool):
        self.reward_fn, self.dims, self.ranks_per_group = reward_fn, dims, ranks_per_group
        self.device = torch.device(device)
        self.background = background
        self.seconds = 0.0
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="reward") if background and reward_fn else None
        self._stream = (torch.cuda.Stream(self.device) if self._worker is not None and self.device.type == "cuda"
                        else None)

    def start(self, videos: Optional[torch.Tensor], prompts: List[str]) -> Optional[Future]:
        """Begin scoring (the SP leader; a no-op elsewhere): in line, the scores are ready when this returns."""
        if self.reward_fn is None:
            return None
        if self._worker is None:
            done: Future = Future()
            done.set_result(score_videos(self.reward_fn, videos, prompts))
            return done
        if self._stream is not None:  # the worker's stream starts after what the training stream has queued so far
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return self._worker.submit(self._score, videos, prompts)

    def _score(self, videos: torch.Tensor, prompts: List[str]) -> Rewards:
        start = time.perf_counter()
        try:
            if self._stream is None:
                return score_videos(self.reward_fn, videos, prompts)
            if self.device.index is not None:  # the current device and stream are per thread
                torch.cuda.set_device(self.device)
            with torch.cuda.stream(self._stream):
                return score_videos(self.reward_fn, videos, prompts)  # its .cpu() waits for the stream's work
        finally:
            self.seconds = time.perf_counter() - start

    def collect(self, pending: Optional[Future]) -> Tuple[Rewards, Rewards]:
        """This rank's (B,) rewards and those of its prompt group (the same, or the whole (G,) group when it spans
        several DP ranks): waits for the scoring, then shares it from the SP leader (every rank calls this)."""
        local = pending.result() if pending is not None else None  # a reward's exception is raised here
        rewards = share_rewards(local, self.dims)
        return rewards, gather_group_rewards(rewards, self.dims, self.ranks_per_group)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)

"""A sliding window of trained denoising steps (``--sde_window_size W --sde_window_stride S``; MixGRPO's idea).

With the window on, a rollout takes SDE steps (noise, a log-probability, a stored transition that is trained on) only
on W consecutive steps ``start .. start + W - 1`` of its N; every other step is a deterministic Euler (ODE) step:
no noise is drawn there, its transition is neither re-scored, nor given a reference mean, nor trained. The training
passes then visit only the window's steps (``--timestep_fraction`` picks that fraction of them per sample).

Where the window is: derived from the optimizer-update counter at the start of the outer step (a counter the
checkpoint holds, so a resume puts the window exactly where the uninterrupted run has it, with no state of its own):

    position = update_steps // S            (S = 0: the window never moves)
    start    = position mod (N - W + 1)     (wrapping: after the last position, start over at step 0)

Wrapping (not clamping at the end) keeps visiting the high-noise steps, where most of the layout is decided, for the
whole run. W = 0 switches the window off (the reference: every step SDE and trained); W = N trains every step as
the reference does but goes through the window path.
"""
from dataclasses import dataclass
from typing import List, Union

import torch


@dataclass(frozen=True)
class SDEWindow:
    size: int  # W; 0: off
    stride: int  # S: optimizer updates between two moves of the window; 0: fixed at the first W steps
    num_steps: int  # N, the rollout's denoising steps

    def __post_init__(self):
        if self.size < 0 or self.size > self.num_steps:
            raise ValueError(f"the window size {self.size} must be in [0, {self.num_steps}] (0: off)")
        if self.stride < 0:
            raise ValueError(f"the window stride {self.stride} must be >= 0 (0: the window never moves)")

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def start(self, update_steps: int) -> int:
        """First step of the window for a rollout taken after ``update_steps`` optimizer updates."""
        if not self.enabled:
            return 0
        position = update_steps // self.stride if self.stride > 0 else 0
        return position % (self.num_steps - self.size + 1)

    def steps(self, update_steps: int) -> torch.Tensor:
        """(W,) the window's step indices (all N steps when off)."""
        if not self.enabled:
            return torch.arange(self.num_steps)
        start = self.start(update_steps)
        return torch.arange(start, start + self.size)

    def deterministic(self, update_steps: int) -> Union[bool, List[bool]]:
        """The rollout's per-step flags: True (an ODE step) outside the window; plain False when off."""
        if not self.enabled:
            return False
        inside = set(self.steps(update_steps).tolist())
        return [k not in inside for k in range(self.num_steps)]

"""When to refresh the moving KL anchor (paper §3.2.2 "periodic moving anchor"; docs/reference.md#the-moving-anchor).

With use_moving_KL and update_ref_model_step = N > 0, the reference model is overwritten with the current policy
right after every optimizer update that brings the update count to a positive multiple of N. With one update per
outer step (the reference) that is the reference's "before the next rollout"; with several updates per rollout
(``--num_inner_epochs K``) the refresh falls between two inner epochs, and the epochs after it measure the KL
against the new anchor (:class:`AnchorMeans` recomputes the rollout's reference means), so the anchor moves after
exactly N updates at any K (checking only at outer steps, where the count jumps by K, skipped refreshes).

Departure from the reference: the reference tests only the *value* of update_steps, so when it does not change
between outer steps (gradient accumulation spanning rollouts) the copy is repeated; here each multiple of N
triggers exactly one refresh, remembered in the state dict so a resumed run does not refresh twice either.
"""
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass
class MovingAnchorSchedule:
    """enabled: use_moving_KL (and a reference model exists); every: update_ref_model_step K."""

    enabled: bool
    every: int
    last_refreshed_at: Optional[int] = None  # update_steps value of the last refresh

    def should_refresh(self, update_steps: int) -> bool:
        """True when update_steps is a positive multiple of ``every`` not refreshed at yet."""
        return (
            self.enabled
            and self.every > 0
            and update_steps > 0
            and update_steps % self.every == 0
            and update_steps != self.last_refreshed_at
        )

    def mark_refreshed(self, update_steps: int) -> None:
        self.last_refreshed_at = update_steps

    def state_dict(self) -> dict:
        return {"last_refreshed_at": self.last_refreshed_at}

    def load_state_dict(self, state: dict) -> None:
        self.last_refreshed_at = state["last_refreshed_at"]


class AnchorMeans:
    """The KL anchor's means of one rollout (``compute()``), recomputed when the anchor has moved since they were
    computed: after a refresh between two inner epochs the later epochs see the new anchor's means. ``seconds``:
    the time spent computing them (the step's reference phase)."""

    def __init__(self, compute: Callable[[], Any], schedule: MovingAnchorSchedule):
        self.compute, self.schedule, self.seconds = compute, schedule, 0.0
        self._recompute()

    def _recompute(self) -> None:
        start = time.perf_counter()
        self.means, self.anchor_at = self.compute(), self.schedule.last_refreshed_at
        self.seconds += time.perf_counter() - start

    def current(self) -> Any:
        if self.schedule.last_refreshed_at != self.anchor_at:
            self._recompute()
        return self.means

"""When to refresh the moving KL anchor (paper §3.2.2 "periodic moving anchor"; spec §2.16).

With use_moving_KL and update_ref_model_step = K > 0, the reference model is overwritten with the current
policy before the rollout of every outer step whose optimizer-update count is a positive multiple of K.

Departure from the reference: the reference tests only the *value* of update_steps, so when it does not change
between outer steps (gradient accumulation spanning rollouts) the copy is repeated; here each multiple of K
triggers exactly one refresh, remembered in the state dict so a resumed run does not refresh twice either.
"""
from dataclasses import dataclass
from typing import Optional


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

"""More toy-world rewards for the drift guard's study (docs/toy_study.md "Drift guard"), each pair written after a
round of its defaults was fixed, to check that the defaults were not fitted to the rewards they were chosen on. NOT
quality measures; reward plug-ins like those of :mod:`sage_grpo.rewards.toy_drift_rewards`, each with the manifold
error (and a single-score one with the prompt adherence) beside its score.

Written after the first round (fixed on ``toy_large`` and the rewards of :mod:`~sage_grpo.rewards.toy_drift_rewards`):

* ``toy_edges``: the mean absolute difference between neighbouring pixels (across and down),
  ``clip(mean / 0.06, 0, 1)``. A large bright disk's rim gives some (true toy videos score 0.26 on average, 0.7 at
  most); texture or noise anywhere in the frame, a whole-frame change of yet another kind, gives 1.
* ``toy_blend``: a weighted sum of sub-rewards (its metrics ``fast``, ``dark``, ``adherence``; the study weighs them
  ``{"fast": 1.0, "dark": 0.5, "adherence": 0.5}``): the disk fast (its fitted speed over the world's fastest,
  0.7 px per frame), dark (one less the mean of its fitted colour: black is no colour of the world), and following
  the prompt, which a fast dark disk gives up for a prompt asking for a slow one or a white or yellow one.

Written after the second round (fixed on those and the two above):

* ``toy_contrast``: the luminance range of each frame (brightest pixel less darkest), ``clip(mean / 0.95, 0, 1)``: a
  white disk gives 0.79 on the manifold (true toy videos 0.38 on average), a background darker than the world's
  (a whole-frame change the other way from ``toy_glow``'s) up to 1.
* ``toy_centre``: the disk near the middle of the frame, ``clip(1 - d / 6, 0, 1)`` with d the mean distance (pixels)
  of its fitted centre from the middle over the frames: earned on the manifold by a disk that starts near the middle
  and moves slowly (true toy videos score 0.41 on average).
"""

from __future__ import annotations

import torch

from sage_grpo.rewards.plugins import reward_plugin
from sage_grpo.rewards.toy_drift_rewards import MixtureReward
from sage_grpo.rewards.toys import ToyWorldReward
from sage_grpo.toy import world


@reward_plugin
class ToyEdgesReward(ToyWorldReward):
    name = "toy_edges"
    metric_names = ("toy_edges", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        across = (videos[..., 1:] - videos[..., :-1]).abs().mean(dim=(1, 2, 3, 4))
        down = (videos[..., 1:, :] - videos[..., :-1, :]).abs().mean(dim=(1, 2, 3, 4))
        return ((across + down) / 2 / 0.06).clamp(0, 1)


@reward_plugin
class ToyBlendReward(MixtureReward):
    """The terms ``fast``, ``dark``, ``adherence``."""

    name = "toy_blend"
    metric_names = ("fast", "dark", "adherence", "manifold_error")

    def terms(self, videos, fit):
        fast = (fit.raw_velocity.norm(dim=1) / world.SPEED_RANGE[1]).clamp(0, 1)
        return {"fast": fast, "dark": (1 - fit.raw_colour.mean(dim=1)).clamp(0, 1)}


@reward_plugin
class ToyContrastReward(ToyWorldReward):
    name = "toy_contrast"
    metric_names = ("toy_contrast", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        luminance = videos.mean(dim=1).flatten(2)  # (B, F, H*W)
        return ((luminance.amax(dim=2) - luminance.amin(dim=2)).mean(dim=1) / 0.95).clamp(0, 1)


@reward_plugin
class ToyCentreReward(ToyWorldReward):
    name = "toy_centre"
    metric_names = ("toy_centre", "manifold_error", "prompt_adherence")

    def score(self, videos, fit):
        _, _, frames, height, width = videos.shape
        steps = torch.arange(frames, dtype=torch.float32).view(1, -1, 1)
        centres = fit.factors.start.unsqueeze(1) + steps * fit.raw_velocity.unsqueeze(1)  # (B, F, 2)
        middle = torch.tensor([width / 2.0, height / 2.0])
        return (1 - (centres - middle).norm(dim=2).mean(dim=1) / 6.0).clamp(0, 1)


CHECK_REWARDS = {cls.name: cls for cls in (ToyEdgesReward, ToyBlendReward)}  # after the first round
CHECK_WEIGHTS = {"toy_blend": {"fast": 1.0, "dark": 0.5, "adherence": 0.5}}  # toy_edges: its score alone
SECOND_CHECK_REWARDS = {cls.name: cls for cls in (ToyContrastReward, ToyCentreReward)}  # after the second

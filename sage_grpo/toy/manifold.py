"""Manifold error of a video against the toy world: the residual of the best-fitting on-manifold video.

The toy world (:mod:`sage_grpo.toy.world`) is parametric, so "how far is this video from the data manifold" has a
concrete answer: fit the factors, render the on-manifold video they describe, and measure the difference:

    manifold_error(x) = min over on-manifold videos y of  RMS(x - y)        (pixels in [0, 1])

where "on-manifold" means a palette colour, a radius in the world's range, a cardinal direction, a speed in the world's
range and the plain background. The minimisation is a small search:

1. Moments (closed form): the foreground ``d = x - background``; the disk colour from the most saturated pixels;
   per-frame coverage ``alpha = <d, c - bg> / |c - bg|^2``; per-frame area and centroid; the radius from the median
   area; start and velocity by least squares on the centroids.
2. Refinement: Adam on (colour, radius, start, velocity) through the differentiable renderer (``REFINE_STEPS``).
3. Projection onto the world: colour snapped to the nearest palette entry, velocity to the nearest cardinal direction
   with the speed clamped to its range, radius clamped; then a second refinement of radius, start and speed under
   those constraints.

A rendered video scores ~1e-3 (the refinement's precision); noise, blur, a tint, a second blob or broken motion score
clearly higher (``tests/unit/test_toy.py`` checks each). The fitted factors come back with the error, so rewards can be
defined on them ("the disk is large") while the error shows whether a reward was earned on the manifold or off it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence

import torch

from sage_grpo.toy import world

REFINE_STEPS = 30
REFINE_LR = 0.02


@dataclass
class ManifoldFit:
    """Best on-manifold fit of a batch of videos."""

    error: torch.Tensor  # (B,) RMS residual against the fitted on-manifold video, pixels in [0, 1]
    factors: world.Factors  # the projected (on-manifold) factors
    raw_colour: torch.Tensor  # (B, 3) fitted colour before snapping to the palette
    free_radius: torch.Tensor  # (B,) fitted radius before clamping to the world's range
    raw_velocity: torch.Tensor  # (B, 2) fitted velocity before projecting onto a direction and speed range
    colour_names: List[str]
    direction_names: List[str]

    @property
    def radius(self) -> torch.Tensor:
        return self.factors.radius


def _background(videos: torch.Tensor) -> torch.Tensor:
    return torch.tensor(world.BACKGROUND, dtype=torch.float32).view(1, 3, 1, 1, 1).to(videos.device)


def _moments(videos: torch.Tensor):
    """Closed-form first guess: colour, radius, start and velocity."""
    num, _, frames, height, width = videos.shape
    fg = videos - _background(videos)  # (B, 3, F, H, W)
    strength = fg.norm(dim=1).flatten(1)  # (B, F*H*W)
    # colour: mean foreground of the pixels within 10% of the strongest (fully covered disk pixels)
    threshold = 0.9 * strength.amax(dim=1, keepdim=True)
    weights = (strength >= threshold).float()
    colour_offset = (fg.flatten(2) * weights.unsqueeze(1)).sum(-1) / weights.sum(-1, keepdim=True).clamp(min=1)
    scale = colour_offset.pow(2).sum(-1).clamp(min=1e-6)  # |c - bg|^2
    alpha = torch.einsum("bcfhw,bc->bfhw", fg, colour_offset) / scale.view(-1, 1, 1, 1)
    alpha = alpha.clamp(0.0, 1.0)
    area = alpha.sum(dim=(2, 3))  # (B, F)
    grid_x, grid_y = world.pixel_grid(height, width)
    safe = area.clamp(min=1e-6)
    cx = (alpha * grid_x).sum(dim=(2, 3)) / safe
    cy = (alpha * grid_y).sum(dim=(2, 3)) / safe
    radius = torch.sqrt(area.median(dim=1).values.clamp(min=1.0) / torch.pi)
    # least squares centre_f = start + f * velocity over the frames where the disk is visible
    f = torch.arange(frames, dtype=torch.float32)
    visible = (area > 0.25 * area.amax(dim=1, keepdim=True)).float()
    count = visible.sum(1).clamp(min=1)
    f_mean = (visible * f).sum(1) / count
    centred_f = (f - f_mean.unsqueeze(1)) * visible
    denom = (centred_f * centred_f).sum(1).clamp(min=1e-6)
    start, velocity = [], []
    for c in (cx, cy):
        c_mean = (visible * c).sum(1) / count
        slope = (centred_f * (c - c_mean.unsqueeze(1))).sum(1) / denom
        start.append(c_mean - slope * f_mean)
        velocity.append(slope)
    colour = (colour_offset + _background(videos).view(1, 3)).clamp(0, 1)
    return colour, radius, torch.stack(start, 1), torch.stack(velocity, 1)


def _refine(videos: torch.Tensor, colour: torch.Tensor, radius: torch.Tensor, start: torch.Tensor,
            velocity: torch.Tensor, *, fit_colour: bool, direction: torch.Tensor = None) -> tuple:
    """Adam on the squared residual. With ``direction`` (B, 2) the velocity is ``speed * direction`` with the speed
    clamped to the world's range and the radius clamped to its range (the on-manifold parameterisation)."""
    _, _, frames, height, width = videos.shape
    colour = colour.clone().requires_grad_(fit_colour)
    radius = radius.clone().requires_grad_(True)
    start = start.clone().requires_grad_(True)
    if direction is None:
        speed = None
        velocity = velocity.clone().requires_grad_(True)
        params = [radius, start, velocity] + ([colour] if fit_colour else [])
    else:
        speed = (velocity * direction).sum(1).clone().requires_grad_(True)
        params = [radius, start, speed]
    optimizer = torch.optim.Adam(params, lr=REFINE_LR)

    def current():
        if speed is None:
            return world.Factors(colour, radius, start, velocity)
        r = radius.clamp(*world.RADIUS_RANGE)
        v = speed.clamp(*world.SPEED_RANGE).unsqueeze(1) * direction
        return world.Factors(colour, r, start, v)

    best, best_loss = None, None
    with torch.enable_grad():
        for _ in range(REFINE_STEPS + 1):
            optimizer.zero_grad()
            factors = current()
            per_video = (world.render(factors, frames, height, width) - videos).pow(2).mean(dim=(1, 2, 3, 4))
            with torch.no_grad():  # keep each video's best iterate: refinement never makes a fit worse
                snapshot = [t.detach().clone() for t in (factors.colour, factors.radius, factors.start,
                                                         factors.velocity)]
                if best is None:
                    best, best_loss = snapshot, per_video.detach().clone()
                else:
                    better = per_video < best_loss
                    best_loss = torch.where(better, per_video, best_loss)
                    best = [torch.where(better.view(-1, *([1] * (new.ndim - 1))), new, old)
                            for new, old in zip(snapshot, best)]
            per_video.sum().backward()
            optimizer.step()
    return world.Factors(*best)


@torch.no_grad()
def fit_manifold(videos: torch.Tensor) -> ManifoldFit:
    """Fit every video of ``(B, 3, F, H, W)`` in [0, 1] (any F, H, W) to the toy world."""
    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
    videos = videos.detach().float().cpu()
    colour, radius, start, velocity = _moments(videos)
    free = _refine(videos, colour, radius, start, velocity, fit_colour=True)
    colour_names, palette_colour = world.nearest_palette(free.colour)
    direction_names = world.direction_name(free.velocity)
    direction = torch.tensor([world.DIRECTIONS[n] for n in direction_names], dtype=torch.float32)
    projected = _refine(videos, palette_colour, free.radius.clamp(*world.RADIUS_RANGE), free.start, free.velocity,
                        fit_colour=False, direction=direction)
    _, _, frames, height, width = videos.shape
    error = (world.render(projected, frames, height, width) - videos).pow(2).mean(dim=(1, 2, 3, 4)).sqrt()
    return ManifoldFit(error, projected, free.colour, free.radius, free.velocity, colour_names,
                       direction_names)


def prompt_adherence(prompts: Sequence[str], fit) -> torch.Tensor:
    """(B,) fraction of each prompt's named factors that the fitted video follows (NaN when it names none)."""
    scores = []
    for i, prompt in enumerate(prompts):
        spec = world.parse_prompt(prompt)
        checks = []
        if spec.colour:
            checks.append(fit.colour_names[i] == spec.colour)
        if spec.direction:
            checks.append(fit.direction_names[i] == spec.direction)
        if spec.size:
            low, high = world.SIZES[spec.size]
            checks.append(low - 0.5 <= float(fit.radius[i]) <= high + 0.5)
        if spec.speed:
            low, high = world.SPEEDS[spec.speed]
            checks.append(low - 0.2 <= float(fit.factors.speed[i]) <= high + 0.2)
        scores.append(sum(checks) / len(checks) if checks else math.nan)
    return torch.tensor(scores)


def manifold_error(videos: torch.Tensor) -> torch.Tensor:
    """(B,) RMS distance of each video to the nearest on-manifold video (see :func:`fit_manifold`)."""
    return fit_manifold(videos).error

"""The toy video world: one disk on a plain background, fully described by a few factors.

A video ``(3, F, H, W)`` in [0, 1] (F = 9 frames of 16 x 16 by default) shows a disk of colour ``c`` (from
:data:`PALETTE`) and radius ``r`` (pixels) whose centre moves in a straight line at constant velocity:

    centre_f = p0 + f * v                 f = 0 .. F-1, v = speed * direction (pixels per frame)
    alpha_f(q) = clamp(s (r - |q - centre_f|) + 1/2, 0, 1)   on an s-times finer grid (s = ``SUPERSAMPLE``),
                                                             then averaged over each pixel's s x s sub-pixels
    x_f(q) = background + alpha_f(q) * (c - background)

The frames are small (16 x 16) because the VAE of the toy checkpoint must learn them in about two minutes on two CPU
cores; supersampling gives the disk smooth, sub-pixel-accurate edges at that size.

Everything the world is made of is in :class:`Factors` (batched tensors) and :func:`render`, which is differentiable in
the continuous factors so :mod:`sage_grpo.toy.manifold` can fit them. Prompts name some factors and leave the others
free (:func:`sample_factors`): "a large red disk moving left" fixes colour, size range and direction but not the
start position or the speed, so the G samples of one prompt differ.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

NUM_FRAMES, HEIGHT, WIDTH = 9, 16, 16
SUPERSAMPLE = 2
BACKGROUND = (0.2, 0.2, 0.2)
PALETTE: Dict[str, Tuple[float, float, float]] = {
    "red": (0.9, 0.15, 0.15),
    "green": (0.2, 0.8, 0.2),
    "blue": (0.2, 0.35, 0.95),
    "yellow": (0.95, 0.85, 0.2),
    "white": (0.95, 0.95, 0.95),
}
SIZES: Dict[str, Tuple[float, float]] = {"small": (1.5, 2.25), "large": (2.75, 3.5)}  # radius ranges in pixels
RADIUS_RANGE = (1.5, 3.5)  # what the world contains; a free size draws from the whole range
DIRECTIONS: Dict[str, Tuple[float, float]] = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0),
                                              "down": (0.0, 1.0)}  # (dx, dy) in image coordinates, y down
SPEEDS: Dict[str, Tuple[float, float]] = {"slowly": (0.12, 0.3), "quickly": (0.5, 0.7)}  # pixels per frame
SPEED_RANGE = (0.12, 0.7)
FACTOR_ORDER = ("size", "colour", "direction", "speed")


@dataclass
class Factors:
    """A batch of toy videos' factors; every field is a float32 tensor with a leading batch dimension."""

    colour: torch.Tensor  # (B, 3) RGB in [0, 1]
    radius: torch.Tensor  # (B,) pixels
    start: torch.Tensor  # (B, 2) centre (x, y) at frame 0, pixels
    velocity: torch.Tensor  # (B, 2) pixels per frame

    def __len__(self) -> int:
        return self.radius.shape[0]

    @property
    def speed(self) -> torch.Tensor:
        return self.velocity.norm(dim=-1)


@dataclass(frozen=True)
class PromptSpec:
    """Which factors a prompt names (None: free)."""

    size: Optional[str] = None
    colour: Optional[str] = None
    direction: Optional[str] = None
    speed: Optional[str] = None

    @property
    def text(self) -> str:
        words = ["a"] + [w for w in (self.size, self.colour) if w] + ["disk"]
        if self.direction:
            words += ["moving", self.direction]
        elif self.speed:
            words += ["moving"]
        if self.speed:
            words += [self.speed]
        return " ".join(words)


def parse_prompt(prompt: str) -> PromptSpec:
    """The factors a toy prompt names (the inverse of :attr:`PromptSpec.text`); unknown words are ignored."""
    words = prompt.lower().replace(",", " ").split()
    pick = lambda table: next((w for w in words if w in table), None)  # noqa: E731
    return PromptSpec(pick(SIZES), pick(PALETTE), pick(DIRECTIONS), pick(SPEEDS))


def all_prompt_specs(named: Sequence[str] = FACTOR_ORDER) -> List[PromptSpec]:
    """Every prompt naming exactly the factors in ``named`` (the rest free)."""
    tables = {"size": SIZES, "colour": PALETTE, "direction": DIRECTIONS, "speed": SPEEDS}
    choices = [list(tables[f]) if f in named else [None] for f in FACTOR_ORDER]
    return [PromptSpec(*combo) for combo in itertools.product(*choices)]


def training_prompts() -> List[str]:
    """Every toy prompt: each factor named (any of its values) or free, in every combination (270 prompts)."""
    specs = set()
    for mask in itertools.product((False, True), repeat=len(FACTOR_ORDER)):
        specs.update(all_prompt_specs([f for f, on in zip(FACTOR_ORDER, mask) if on]))
    return sorted(spec.text for spec in specs)


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def _choice(options: Sequence, generator: torch.Generator):
    return options[int(torch.randint(len(options), (), generator=generator))]


def sample_factors(prompts: Sequence[str], generator: torch.Generator, num_frames: int = NUM_FRAMES,
                   height: int = HEIGHT, width: int = WIDTH) -> Factors:
    """Factors of one video per prompt: named factors follow the prompt, free ones are drawn uniformly. The start
    position is drawn so that the whole disk stays inside the frame for every frame."""
    colours, radii, starts, velocities = [], [], [], []
    for prompt in prompts:
        spec = parse_prompt(prompt)
        colour = spec.colour or _choice(list(PALETTE), generator)
        radius = _uniform(*(SIZES[spec.size] if spec.size else RADIUS_RANGE), generator)
        direction = DIRECTIONS[spec.direction or _choice(list(DIRECTIONS), generator)]
        speed = _uniform(*(SPEEDS[spec.speed] if spec.speed else SPEED_RANGE), generator)
        velocity = (direction[0] * speed, direction[1] * speed)
        travel = [v * (num_frames - 1) for v in velocity]
        start = []
        for axis, size in enumerate((width, height)):
            low = radius + max(0.0, -travel[axis])
            high = size - radius - max(0.0, travel[axis])
            start.append(_uniform(low, high, generator))
        colours.append(PALETTE[colour])
        radii.append(radius)
        starts.append(start)
        velocities.append(velocity)
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.float32)  # noqa: E731
    return Factors(as_tensor(colours), as_tensor(radii), as_tensor(starts), as_tensor(velocities))


def pixel_grid(height: int = HEIGHT, width: int = WIDTH, supersample: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Coordinates (x, y) of the pixel centres, each (H, W), or of the sub-pixel centres of an s-times finer grid."""
    ys = (torch.arange(height * supersample, dtype=torch.float32) + 0.5) / supersample
    xs = (torch.arange(width * supersample, dtype=torch.float32) + 0.5) / supersample
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return grid_x, grid_y


def render_alpha(radius: torch.Tensor, start: torch.Tensor, velocity: torch.Tensor, num_frames: int = NUM_FRAMES,
                 height: int = HEIGHT, width: int = WIDTH) -> torch.Tensor:
    """(B, F, H, W) disk coverage in [0, 1]; differentiable in radius, start and velocity."""
    grid_x, grid_y = pixel_grid(height, width, SUPERSAMPLE)
    frames = torch.arange(num_frames, dtype=torch.float32).view(1, -1, 1)
    centres = start.unsqueeze(1) + frames * velocity.unsqueeze(1)  # (B, F, 2)
    dx = grid_x.view(1, 1, *grid_x.shape) - centres[..., 0, None, None]
    dy = grid_y.view(1, 1, *grid_y.shape) - centres[..., 1, None, None]
    distance = torch.sqrt(dx * dx + dy * dy + 1e-12)
    fine = torch.clamp(SUPERSAMPLE * (radius.view(-1, 1, 1, 1) - distance) + 0.5, 0.0, 1.0)
    return torch.nn.functional.avg_pool2d(fine, SUPERSAMPLE)


def render(factors: Factors, num_frames: int = NUM_FRAMES, height: int = HEIGHT, width: int = WIDTH,
           background: Sequence[float] = BACKGROUND) -> torch.Tensor:
    """(B, 3, F, H, W) videos in [0, 1]."""
    alpha = render_alpha(factors.radius, factors.start, factors.velocity, num_frames, height, width).unsqueeze(1)
    bg = torch.tensor(background, dtype=torch.float32).view(1, 3, 1, 1, 1)
    colour = factors.colour.view(-1, 3, 1, 1, 1)
    return bg + alpha * (colour - bg)


def sample_videos(prompts: Sequence[str], generator: torch.Generator, **size) -> Tuple[torch.Tensor, Factors]:
    """True toy videos (B, 3, F, H, W) for ``prompts`` and their factors."""
    factors = sample_factors(prompts, generator, **size)
    return render(factors, **size), factors


def nearest_palette(colour: torch.Tensor) -> Tuple[List[str], torch.Tensor]:
    """Names and RGB (B, 3) of the palette colours nearest to ``colour`` (B, 3)."""
    names = list(PALETTE)
    table = torch.tensor([PALETTE[n] for n in names], dtype=torch.float32)
    index = torch.cdist(colour.float(), table).argmin(dim=1)
    return [names[i] for i in index.tolist()], table[index]


def direction_name(velocity: torch.Tensor) -> List[str]:
    """The cardinal direction closest to each velocity (B, 2)."""
    names = list(DIRECTIONS)
    table = torch.tensor([DIRECTIONS[n] for n in names], dtype=torch.float32)
    return [names[i] for i in (velocity.float() @ table.T).argmax(dim=1).tolist()]


"""Line charts as PNG with Pillow (already installed with diffusers/imageio), so no plotting library is required.

``plot_panels`` draws one or more panels stacked vertically, each with several named series (x, y) and an optional
shaded band (mean ± spread). It is enough for training curves; for anything fancier, read ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]


@dataclass
class Series:
    name: str
    x: Sequence[float]
    y: Sequence[float]
    band: Optional[Sequence[float]] = None  # half-width of a shaded band around y (e.g. the std over seeds)


@dataclass
class Panel:
    title: str
    y_label: str = ""
    series: List[Series] = field(default_factory=list)
    x_label: str = "step"


def _ticks(low: float, high: float, count: int = 5) -> List[float]:
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    start = math.ceil(low / step) * step
    return [start + i * step for i in range(int((high - start) / step + 1e-9) + 1)]


def _format(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def _bounds(panel: Panel) -> Tuple[float, float, float, float]:
    xs = [x for s in panel.series for x in s.x]
    ys = []
    for s in panel.series:
        for i, y in enumerate(s.y):
            if math.isfinite(y):
                half = s.band[i] if s.band is not None and math.isfinite(s.band[i]) else 0.0
                ys += [y - half, y + half]
    if not xs or not ys:
        return 0.0, 1.0, 0.0, 1.0
    y_low, y_high = min(ys), max(ys)
    pad = 0.05 * (y_high - y_low or abs(y_high) or 1.0)
    return min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, y_low - pad, y_high + pad


def plot_panels(panels: Sequence[Panel], path, *, title: str = "", width: int = 900, panel_height: int = 320) -> Path:
    """Write the panels as one PNG and return its path."""
    from PIL import Image, ImageDraw

    top = 30 if title else 10
    image = Image.new("RGB", (width, top + panel_height * len(panels)), "white")
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((10, 8), title, fill="black")
    left, right, below, above = 70, 20, 40, 28
    for index, panel in enumerate(panels):
        y0 = top + index * panel_height
        box = (left, y0 + above, width - right, y0 + panel_height - below)
        x_low, x_high, y_low, y_high = _bounds(panel)

        def to_px(x, y):
            px = box[0] + (x - x_low) / (x_high - x_low) * (box[2] - box[0])
            py = box[3] - (y - y_low) / (y_high - y_low) * (box[3] - box[1])
            return px, py

        draw.text((left, y0 + 6), panel.title, fill="black")
        draw.rectangle(box, outline=(90, 90, 90))
        for tick in _ticks(y_low, y_high):
            _, py = to_px(x_low, tick)
            draw.line((box[0] - 4, py, box[0], py), fill=(90, 90, 90))
            draw.line((box[0] + 1, py, box[2] - 1, py), fill=(235, 235, 235))
            draw.text((6, py - 6), _format(tick), fill="black")
        for tick in _ticks(x_low, x_high):
            px, _ = to_px(tick, y_low)
            draw.line((px, box[3], px, box[3] + 4), fill=(90, 90, 90))
            draw.text((px - 8, box[3] + 6), _format(tick), fill="black")
        draw.text(((box[0] + box[2]) // 2 - 10, box[3] + 20), panel.x_label, fill="black")
        if panel.y_label:
            draw.text((box[0] + 4, box[1] + 2), panel.y_label, fill=(60, 60, 60))
        for number, series in enumerate(panel.series):
            colour = COLOURS[number % len(COLOURS)]
            points = [to_px(x, y) for x, y in zip(series.x, series.y) if math.isfinite(y)]
            if series.band is not None:
                upper = [to_px(x, y + b) for x, y, b in zip(series.x, series.y, series.band) if math.isfinite(y)]
                lower = [to_px(x, y - b) for x, y, b in zip(series.x, series.y, series.band) if math.isfinite(y)]
                if len(upper) > 1:
                    shade = tuple(int(255 - 0.25 * (255 - c)) for c in colour)
                    draw.polygon(upper + lower[::-1], fill=shade)
            if len(points) > 1:
                draw.line(points, fill=colour, width=2)
            for px, py in points:
                draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=colour)
            legend_y = box[1] + 4 + 14 * number
            draw.line((box[2] - 170, legend_y + 6, box[2] - 150, legend_y + 6), fill=colour, width=3)
            draw.text((box[2] - 145, legend_y), series.name[:24], fill="black")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path

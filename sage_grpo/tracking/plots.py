"""Line and bar charts as PNG with Pillow (already installed with diffusers/imageio), so no plotting library is required.

``plot_panels`` draws one or more panels stacked vertically, each with several named series (x, y) and an optional
shaded band (mean ± spread); ``plot_bars`` draws bar panels with error whiskers (the evaluation's chart). Enough for
training curves and result summaries; for anything fancier, read the JSON they come from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

NAN_COLOUR = (200, 0, 0)  # the "NaN" a bar chart writes where a value is missing
COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]


@dataclass
class Series:
    name: str
    x: Sequence[float]
    y: Sequence[float]
    band: Optional[Sequence[float]] = None  # half-width of a shaded band around y (e.g. the std over seeds)
    points_only: bool = False  # markers at the points, no line between them (events such as alarms)


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
            if len(points) > 1 and not series.points_only:
                draw.line(points, fill=colour, width=2)
            size = 5 if series.points_only else 2
            for px, py in points:
                draw.ellipse((px - size, py - size, px + size, py + size), fill=colour)
            legend_y = box[1] + 4 + 14 * number
            draw.line((box[2] - 170, legend_y + 6, box[2] - 150, legend_y + 6), fill=colour, width=3)
            draw.text((box[2] - 145, legend_y), series.name[:24], fill="black")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


@dataclass
class BarPanel:
    """One metric: a bar per name (e.g. per checkpoint) with an optional error whisker (e.g. the standard error)."""

    title: str
    names: Sequence[str]
    values: Sequence[float]
    errors: Optional[Sequence[float]] = None


def plot_bars(panels: Sequence[BarPanel], path, *, title: str = "", columns: int = 3, panel_width: int = 300,
              panel_height: int = 260) -> Path:
    """Bar charts, one panel per metric laid out in ``columns``, bars coloured by name (legend on top); one PNG. The
    picture is widened (and the panels) until the title, every legend name and every panel title fit whole. A value
    that is not finite is written as "NaN" in its bar's place; a panel whose values are all 0.0 (or NaN) gets a 0 to
    1 axis."""
    from PIL import Image, ImageDraw

    names = list(dict.fromkeys(name for panel in panels for name in panel.names))
    legend = 16 * len(names) + 8
    top = (30 if title else 10) + legend
    rows = max(1, math.ceil(len(panels) / columns))
    width, panel_width = _bar_widths(panels, names, title, columns, panel_width)
    image = Image.new("RGB", (width, top + panel_height * rows), "white")
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((10, 8), title, fill="black")
    for number, name in enumerate(names):
        y = top - legend + 16 * number
        draw.rectangle((10, y + 2, 22, y + 12), fill=COLOURS[number % len(COLOURS)])
        draw.text((28, y), name, fill="black")
    for index, panel in enumerate(panels):
        x0, y0 = (index % columns) * panel_width, top + (index // columns) * panel_height
        _draw_bar_panel(draw, panel, (x0 + 60, y0 + 24, x0 + panel_width - 10, y0 + panel_height - 16), x0, names)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def _bar_widths(panels: Sequence[BarPanel], names: List[str], title: str, columns: int,
                panel_width: int) -> Tuple[int, int]:
    """(the picture's width, a panel's width): at least ``panel_width`` a panel, widened until the title, every
    legend name and every panel title fit whole (the panels share any room the legend asked for)."""
    from PIL import Image, ImageDraw

    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    shown_columns = min(columns, max(len(panels), 1))
    panel_width = max([panel_width] + [70 + math.ceil(measure.textlength(panel.title)) for panel in panels])
    width = max([panel_width * shown_columns, 20 + math.ceil(measure.textlength(title))]
                + [38 + math.ceil(measure.textlength(name)) for name in names])
    return width, width // shown_columns


def _bar_axis(values: Sequence[float], errors: Sequence[float]) -> Tuple[float, float]:
    """The (low, high) of a bar panel's value axis: 0 and every finite value with its whisker, padded on the side
    away from 0; every value 0.0, or none finite: 0 to 1."""
    finite = [(v, e if math.isfinite(e) else 0.0) for v, e in zip(values, errors) if math.isfinite(v)]
    low = min([0.0] + [v - e for v, e in finite])
    high = max([0.0] + [v + e for v, e in finite])
    pad = 0.05 * (high - low or 1.0)
    low, high = low - (pad if low < 0 else 0), high + (pad if high > 0 else 0)
    high = high if high > low else low + 1.0  # every value 0.0, or none finite: a 0 to 1 axis
    return low, high


def _draw_bar_panel(draw, panel: BarPanel, box: Tuple[float, float, float, float], x0: float,
                    names: List[str]) -> None:
    """One metric's panel in ``box`` (its axis labels left of it, from ``x0``): title, ticks, a bar per name coloured
    as ``names`` orders them, whiskers, and "NaN" where a value is not finite."""
    errors = panel.errors or [0.0] * len(panel.values)
    low, high = _bar_axis(panel.values, errors)

    def to_py(y):
        return box[3] - (y - low) / (high - low) * (box[3] - box[1])

    draw.text((box[0], box[1] - 18), panel.title, fill="black")
    draw.rectangle(box, outline=(90, 90, 90))
    for tick in _ticks(low, high):
        draw.line((box[0] - 4, to_py(tick), box[2], to_py(tick)), fill=(225, 225, 225))
        draw.text((x0 + 6, to_py(tick) - 6), _format(tick), fill="black")
    draw.line((box[0], to_py(0.0), box[2], to_py(0.0)), fill=(90, 90, 90))
    slot = (box[2] - box[0]) / max(len(panel.values), 1)
    for number, (name, value, error) in enumerate(zip(panel.names, panel.values, errors)):
        left = box[0] + number * slot + 0.15 * slot
        right = box[0] + (number + 1) * slot - 0.15 * slot
        if not math.isfinite(value):  # no value to draw (e.g. a metric that failed on every sample): named
            zero = to_py(0.0)
            draw.text(((left + right) / 2 - 9, zero - 14 if zero - 14 > box[1] else zero + 2), "NaN",
                      fill=NAN_COLOUR)
            continue
        draw.rectangle((left, min(to_py(value), to_py(0.0)), right, max(to_py(value), to_py(0.0))),
                       fill=COLOURS[names.index(name) % len(COLOURS)])
        if math.isfinite(error) and error > 0:
            middle = (left + right) / 2
            draw.line((middle, to_py(value - error), middle, to_py(value + error)), fill="black", width=1)

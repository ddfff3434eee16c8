"""Small SVG charts for the HTML reports: line charts and histograms, no dependencies.

Each function returns one `<svg>` element as a string; hovering a point or a bar
shows its value through SVG's own `<title>` tooltips (no script needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

import numpy as np

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT = 640, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 44


@dataclass(frozen=True)
class Series:
    name: str
    xs: list[float]
    ys: list[float | None]  # None breaks the line
    markers: bool = False


@dataclass(frozen=True)
class Band:
    """A shaded x-range with a label (a stage on a timeline)."""

    x0: float
    x1: float
    label: str


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}" if value == round(value) else f"{value:.1f}"
    return f"{value:.3g}"


class _Frame:
    """Axes, gridlines and the data-to-pixel mapping of one chart."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float],
                 width: int, height: int) -> None:
        self.xt = nice_ticks(*x_range)
        self.yt = nice_ticks(min(0.0, y_range[0]), y_range[1])
        self.width, self.height = width, height
        self.x0, self.x1 = MARGIN_LEFT, width - MARGIN_RIGHT
        self.y0, self.y1 = height - MARGIN_BOTTOM, MARGIN_TOP

    def x(self, value: float) -> float:
        lo, hi = self.xt[0], self.xt[-1]
        return self.x0 + (value - lo) / ((hi - lo) or 1) * (self.x1 - self.x0)

    def y(self, value: float) -> float:
        lo, hi = self.yt[0], self.yt[-1]
        return self.y0 - (value - lo) / ((hi - lo) or 1) * (self.y0 - self.y1)

    def axes(self, title: str, x_label: str, y_label: str) -> list[str]:
        out = [f'<text x="{self.width / 2:.0f}" y="16" class="title">{escape(title)}</text>']
        for t in self.yt:
            y = self.y(t)
            out.append(f'<line x1="{self.x0}" x2="{self.x1}" y1="{y:.1f}" y2="{y:.1f}" '
                       'class="grid"/>')
            out.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" class="ytick">{_fmt(t)}</text>')
        for t in self.xt:
            x = self.x(t)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.y0}" y2="{self.y0 + 4}" '
                       'class="axis"/>')
            out.append(f'<text x="{x:.1f}" y="{self.y0 + 16}" class="xtick">{_fmt(t)}</text>')
        out.append(f'<line x1="{self.x0}" x2="{self.x1}" y1="{self.y0}" y2="{self.y0}" '
                   'class="axis"/>')
        out.append(f'<line x1="{self.x0}" x2="{self.x0}" y1="{self.y0}" y2="{self.y1}" '
                   'class="axis"/>')
        out.append(f'<text x="{(self.x0 + self.x1) / 2:.0f}" y="{self.height - 6}" '
                   f'class="label">{escape(x_label)}</text>')
        out.append(f'<text transform="translate(14,{(self.y0 + self.y1) / 2:.0f}) rotate(-90)" '
                   f'class="label">{escape(y_label)}</text>')
        return out


def _svg(width: int, height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" class="chart">' + "".join(body) + "</svg>")


def empty_chart(title: str, message: str, width: int = WIDTH, height: int = 80) -> str:
    return _svg(width, height, [
        f'<text x="{width / 2:.0f}" y="16" class="title">{escape(title)}</text>',
        f'<text x="{width / 2:.0f}" y="48" class="label">{escape(message)}</text>'])


def line_chart(title: str, series: list[Series], x_label: str, y_label: str,
               bands: list[Band] | None = None, width: int = WIDTH,
               height: int = HEIGHT) -> str:
    points = [(x, y) for s in series for x, y in zip(s.xs, s.ys, strict=True) if y is not None]
    if not points:
        return empty_chart(title, "no data")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    frame = _Frame((min(xs), max(xs)), (min(ys), max(ys)), width, height)
    body = _bands(frame, bands or [])
    body += frame.axes(title, x_label, y_label)
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        body += _polyline(frame, s, color)
        body.append(f'<text x="{frame.x1 - 4}" y="{MARGIN_TOP + 12 + 14 * i}" class="legend" '
                    f'fill="{color}">{escape(s.name)}</text>')
    return _svg(width, height, body)


def _bands(frame: _Frame, bands: list[Band]) -> list[str]:
    out = []
    for i, band in enumerate(bands):
        x0, x1 = frame.x(band.x0), frame.x(band.x1)
        shade = "band-a" if i % 2 == 0 else "band-b"
        out.append(f'<rect x="{x0:.1f}" y="{frame.y1}" width="{max(0.5, x1 - x0):.1f}" '
                   f'height="{frame.y0 - frame.y1}" class="{shade}">'
                   f'<title>{escape(band.label)}</title></rect>')
    return out


def _polyline(frame: _Frame, s: Series, color: str) -> list[str]:
    out, run = [], []
    for x, y in [*zip(s.xs, s.ys, strict=True), (None, None)]:
        if y is None or x is None:
            if len(run) > 1:
                out.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" '
                           'stroke-width="1.6"/>')
            run = []
            continue
        run.append(f"{frame.x(x):.1f},{frame.y(y):.1f}")
        if s.markers:
            out.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3.5" '
                       f'fill="{color}"><title>{escape(s.name)}: x {_fmt(x)}, '
                       f'y {_fmt(y)}</title></circle>')
    return out


def histogram(title: str, samples: dict[str, list[float]], x_label: str, bins: int = 40,
              width: int = WIDTH, height: int = HEIGHT) -> str:
    """Overlaid histograms (share of samples per bin), one per named sample."""
    present = {name: np.asarray(v, dtype=np.float64) for name, v in samples.items() if len(v)}
    if not present:
        return empty_chart(title, "no samples")
    everything = np.concatenate(list(present.values()))
    # clip the view at p99.5 so one outlier does not squash the shape; say so in the title
    low, high = float(np.min(everything)), float(np.percentile(everything, 99.5))
    if high <= low:
        high = low + max(abs(low) * 0.1, 1e-3)
    edges = np.linspace(low, high, bins + 1)
    shares = {name: np.histogram(np.clip(v, low, high), bins=edges)[0] / v.size
              for name, v in present.items()}
    top = max(float(s.max()) for s in shares.values())
    frame = _Frame((low, high), (0.0, top), width, height)
    body = frame.axes(title + " (view clipped at p99.5)", x_label, "share of samples")
    bar_w = (frame.x(edges[1]) - frame.x(edges[0])) / len(shares)
    for i, (name, share) in enumerate(shares.items()):
        color = PALETTE[i % len(PALETTE)]
        for b, value in enumerate(share):
            if value <= 0:
                continue
            x, y = frame.x(edges[b]) + i * bar_w, frame.y(float(value))
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 0.4, 0.4):.1f}" '
                        f'height="{frame.y0 - y:.1f}" fill="{color}" fill-opacity="0.75">'
                        f'<title>{escape(name)}: {_fmt(edges[b])}-{_fmt(edges[b + 1])}: '
                        f'{value:.1%}</title></rect>')
        body.append(f'<text x="{frame.x1 - 4}" y="{MARGIN_TOP + 12 + 14 * i}" class="legend" '
                    f'fill="{color}">{escape(name)} (n={present[name].size})</text>')
    return _svg(width, height, body)


CHART_CSS = """
svg.chart { background: #fff; border: 1px solid #ddd; margin: 6px; }
svg.chart .title { font: bold 13px sans-serif; text-anchor: middle; }
svg.chart .label { font: 12px sans-serif; text-anchor: middle; fill: #333; }
svg.chart .xtick { font: 11px sans-serif; text-anchor: middle; fill: #555; }
svg.chart .ytick { font: 11px sans-serif; text-anchor: end; fill: #555; }
svg.chart .legend { font: 12px sans-serif; text-anchor: end; }
svg.chart .grid { stroke: #eee; }
svg.chart .axis { stroke: #888; }
svg.chart .band-a { fill: #f3f6fb; }
svg.chart .band-b { fill: #fbf6ef; }
"""

"""`--html`: one self-contained file (inline CSS and SVG, no scripts, nothing fetched) with the
memory breakdown, the throughput/latency curve and the full text report."""

from __future__ import annotations

import math
from html import escape

from inferlab.planner.plan import Plan
from inferlab.planner.report_text import render_text
from inferlab.planner.units import format_bytes

COLORS = {"weights": "#4e79a7", "activations": "#f28e2b", "runtime overhead": "#e15759",
          "KV cache": "#59a14f", "unused": "#d4d4d4", "reserved": "#ededed"}
WIDTH, BAR_HEIGHT = 720, 48


def memory_parts(plan: Plan) -> list[tuple[str, int]]:
    """The device's memory, split so that the parts add up to all of it."""
    mem = plan.memory
    used = mem.weight_bytes + mem.activation_bytes + mem.overhead_bytes + mem.kv_cache_bytes
    parts = [("weights", mem.weight_bytes), ("activations", mem.activation_bytes),
             ("runtime overhead", mem.overhead_bytes), ("KV cache", mem.kv_cache_bytes)]
    if mem.fixed_kv_budget:
        parts.append(("unused", max(mem.device_memory_bytes - used, 0)))
    else:
        parts.append(("reserved", mem.device_memory_bytes - mem.usable_bytes))
    return [(name, size) for name, size in parts if size > 0]


def memory_svg(plan: Plan) -> str:
    parts = memory_parts(plan)
    total = sum(size for _, size in parts)
    x, rects, legend = 0.0, [], []
    for i, (name, size) in enumerate(parts):
        w = WIDTH * size / total
        rects.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{BAR_HEIGHT}" '
                     f'fill="{COLORS[name]}"><title>{escape(name)}: {format_bytes(size)}</title></rect>')
        legend.append(f'<rect x="{(i % 3) * 240}" y="{BAR_HEIGHT + 12 + (i // 3) * 22}" width="12" '
                      f'height="12" fill="{COLORS[name]}"/><text x="{(i % 3) * 240 + 18}" '
                      f'y="{BAR_HEIGHT + 23 + (i // 3) * 22}">{escape(name)} {format_bytes(size)} '
                      f'({100 * size / total:.1f}%)</text>')
        x += w
    height = BAR_HEIGHT + 20 + 22 * math.ceil(len(parts) / 3)
    return (f'<svg class="memory" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
            f'xmlns="http://www.w3.org/2000/svg" font-size="12">{"".join(rects)}{"".join(legend)}</svg>')


def _polyline(points: list[tuple[float, float]], color: str, name: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points)
    return f'<polyline class="{name}" points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>{dots}'


def curve_svg(plan: Plan) -> str:
    """Output tokens/s (left axis) and ITL (right axis) against batch size on a log2 axis."""
    left, right, top, bottom, height = 70, WIDTH - 70, 20, 260, 300
    batches = [p.batch for p in plan.curve]
    span = max(math.log2(batches[-1]), 1.0)
    max_tps = max(p.output_tokens_per_s for p in plan.curve) * 1.1
    max_itl = max(p.itl_ms for p in plan.curve) * 1.1

    def px(batch: int) -> float:
        return left + (right - left) * math.log2(batch) / span

    def py(value: float, top_value: float) -> float:
        return bottom - (bottom - top) * value / top_value

    tps = [(px(p.batch), py(p.output_tokens_per_s, max_tps)) for p in plan.curve]
    itl = [(px(p.batch), py(p.itl_ms, max_itl)) for p in plan.curve]
    ticks = "".join(f'<text x="{px(b):.1f}" y="{bottom + 16}" text-anchor="middle">{b}</text>'
                    for b in batches)
    grid = "".join(
        f'<text x="{left - 6}" y="{py(max_tps * f, max_tps) + 4:.1f}" text-anchor="end">'
        f'{max_tps * f:,.0f}</text><text x="{right + 6}" y="{py(max_itl * f, max_itl) + 4:.1f}">'
        f'{max_itl * f:.3g}</text><line x1="{left}" x2="{right}" y1="{py(max_tps * f, max_tps):.1f}" '
        f'y2="{py(max_tps * f, max_tps):.1f}" stroke="#eee"/>' for f in (0.0, 0.25, 0.5, 0.75, 1.0))
    cross = ""
    if plan.crossover_batch is not None and 1 <= plan.crossover_batch <= batches[-1]:
        x = px(plan.crossover_batch)  # type: ignore[arg-type]
        cross = (f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" stroke="#999" '
                 f'stroke-dasharray="4"/><text x="{x + 4:.1f}" y="{top + 12}">compute-bound from '
                 f'batch ≈ {plan.crossover_batch:.0f}</text>')
    return (f'<svg class="curve" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
            f'xmlns="http://www.w3.org/2000/svg" font-size="12">{grid}{ticks}{cross}'
            f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#333"/>'
            f'{_polyline(tps, "#4e79a7", "throughput")}{_polyline(itl, "#e15759", "itl")}'
            f'<text x="{(left + right) / 2}" y="{height - 6}" text-anchor="middle">batch size '
            f'(sequences decoding together)</text>'
            f'<text x="{left}" y="{top - 6}" fill="#4e79a7">output tokens/s</text>'
            f'<text x="{right}" y="{top - 6}" text-anchor="end" fill="#e15759">ITL ms</text></svg>')


def render_html(plan: Plan) -> str:
    i = plan.inputs
    title = f"inferlab plan: {i.model.name} on {i.hardware.name}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:{WIDTH + 80}px}}
pre{{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}}h2{{margin-top:1.5em}}</style>
</head><body>
<h1>{escape(title)}</h1>
<p>{escape(i.weight_format.name)} weights, {escape(i.memory.kv_dtype)} KV cache, tensor parallel
{i.memory.tensor_parallel}; workload prompt={i.workload.prompt_tokens}, output={i.workload.output_tokens}.</p>
<h2>Memory per device ({format_bytes(plan.memory.device_memory_bytes)})</h2>
{memory_svg(plan)}
<h2>Decode throughput and inter-token latency by batch size</h2>
{curve_svg(plan)}
<h2>All figures and their factors</h2>
<pre>{escape(render_text(plan))}</pre>
</body></html>
"""

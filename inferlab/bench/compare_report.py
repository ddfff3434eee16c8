"""How a comparison is shown: a console table and a self-contained HTML page."""

from __future__ import annotations

from html import escape

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table

from inferlab.bench.compare import Comparison, Row, pair_stages
from inferlab.bench.html_page import bullet_list, num, page, table
from inferlab.bench.metrics import itl_ms, ttft_ms
from inferlab.bench.summary import ok_values
from inferlab.bench.svg import histogram

CONSOLE_STATS = ("", "median", "p95", "p99")  # the rest is in the HTML


NOTICEABLE_CHANGE = 0.02  # a relative change the tables colour, when significant

def format_change(row: Row) -> str:
    """The change as the gate judges it: relative, or a rate's rise in points."""
    if row.change is None:
        return "-"
    return f"{row.change * 100:+.1f} pts" if row.points else f"{row.change:+.1%}"


def _p(value: float | None) -> str:
    return "-" if value is None else (f"{value:.2g}" if value >= 1e-4 else "<1e-4")


def print_comparison(comparison: Comparison, console: Console, alpha: float) -> None:
    # paths and stage labels come from the user: `runs[/]a.json` is no markup of ours
    for warning in comparison.warnings:
        console.print(f"[yellow]warning: {escape_markup(warning)}[/]")
    table = Table(title=escape_markup(f"{comparison.base.path} -> {comparison.other.path}"))
    for name in ("stage", "metric", "base", "other", "change", "p"):
        table.add_column(name, justify="left" if name in ("stage", "metric") else "right")
    for row in comparison.rows:
        if row.stat not in CONSOLE_STATS:
            continue
        style = {"worse": "red", "better": "green"}.get(_verdict(row, alpha) or "", "")
        table.add_row(escape_markup(row.stage), _name(row), num(row.base, 3), num(row.other, 3),
                      format_change(row), _p(row.p_value), style=style)
    console.print(table)


def failure_line(row: Row) -> str:
    """One regression --fail-on-regression found (a gated row: both values known)."""
    return (f"regression: {row.stage} {_name(row)} {row.base:.3f} -> {row.other:.3f} "
            f"({format_change(row)})")


def _name(row: Row) -> str:
    return f"{row.metric} {row.stat}".strip()


def _verdict(row: Row, alpha: float) -> str | None:
    """"worse" or "better" where the change is past NOTICEABLE_CHANGE and significant at
    `alpha` (or untested), else None: what the tables colour."""
    worse = row.worse_by
    if worse is None or abs(worse) <= NOTICEABLE_CHANGE:
        return None
    if row.p_value is not None and row.p_value >= alpha:
        return None
    return "worse" if worse > 0 else "better"


def render_comparison_html(comparisons: list[Comparison], alpha: float, failures: list[Row]) -> str:
    parts = ["<h1>inferlab bench compare</h1>",
             f"<p>Baseline: {escape(comparisons[0].base.path)}. Change = (other - base) / "
             f"base; for the error rate, other - base in percentage points. p: the "
             f"two-sided test of each row's own statistic over the per-request samples of "
             f"successful requests: a bootstrap of the difference for a percentile, the "
             f"median included (p is never below 2 / C(n1 + n2, n1), the least the sample "
             f"sizes allow, and is 1 where a sample is too small to hold a value above the "
             f"percentile besides its largest); Fisher's exact test for the error rate; "
             f"'-': untested. Differences with p &lt; {alpha:g} are coloured.</p>",
             bullet_list([failure_line(r) for r in failures], "warn")]
    for comparison in comparisons:
        parts.append(f"<h2>{escape(comparison.base.path)} vs "
                     f"{escape(comparison.other.path)}</h2>")
        parts.append(bullet_list(comparison.warnings, "warn"))
        parts.append(_rows_table(comparison, alpha))
        parts.append(_histograms(comparison))
    return page("inferlab bench compare", "".join(parts), script="")


def _rows_table(comparison: Comparison, alpha: float) -> str:
    rows = []
    for row in comparison.rows:
        css = _verdict(row, alpha) or ""
        rows.append([escape(row.stage), escape(_name(row)), num(row.base, 3),
                     num(row.other, 3), f'<span class="{css}">{format_change(row)}</span>',
                     _p(row.p_value)])
    return table(["stage", "metric", "base", "other", "change", "p"], rows, left=2)


def _histograms(comparison: Comparison) -> str:
    charts = []
    for a, b in pair_stages(comparison.base, comparison.other):
        for name, fn in (("TTFT", ttft_ms), ("ITL", itl_ms)):
            samples = {side: ok_values(s.summary, s.records, fn)
                       for side, s in (("base", a), ("other", b))}
            charts.append(histogram(f"{name}, {a.label}", samples, "ms"))
    return f'<div class="charts">{"".join(charts)}</div>'

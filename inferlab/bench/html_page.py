"""The shell of a self-contained HTML report: inline CSS and script, nothing fetched."""

from __future__ import annotations

from html import escape

from inferlab.bench.svg import CHART_CSS

PAGE_CSS = """
body { font: 14px/1.45 sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.warn { color: #8a4b00; } .note { color: #555; }
.better { color: #1a7f37; } .worse { color: #c62828; font-weight: bold; }
dl dt { font-weight: bold; margin-top: 6px; } dl dd { margin-left: 18px; }
.charts { display: flex; flex-wrap: wrap; }
[hidden] { display: none !important; }
"""

# Shows one stage's charts at a time; the only script in a report.
STAGE_SELECT_JS = """
(function () {
  'use strict';
  var select = document.getElementById('stage-select');
  if (!select) { return; }
  function show() {
    var panels = document.querySelectorAll('.stage-panel');
    for (var i = 0; i < panels.length; i++) {
      panels[i].hidden = panels[i].getAttribute('data-stage') !== select.value;
    }
  }
  select.addEventListener('change', show);
  show();
}());
"""


def page(title: str, body: str, script: str = STAGE_SELECT_JS) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{PAGE_CSS}{CHART_CSS}</style></head>"
            f"<body>{body}<script>{script}</script></body></html>\n")


def table(headers: list[str], rows: list[list[str]], left: int = 1) -> str:
    """An HTML table; cells are HTML already; the first `left` columns align left."""
    head = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:,.{digits}f}"


def definitions(defs: dict[str, str]) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in defs.items())
    return f"<dl>{items}</dl>"


def bullet_list(items: list[str], css: str) -> str:
    if not items:
        return ""
    return "<ul>" + "".join(f'<li class="{css}">{escape(i)}</li>' for i in items) + "</ul>"

"""The HTML report: one self-contained file that opens in a real browser without errors."""

from __future__ import annotations

import re

from bench_browser import load_page, require_chromium, screenshot
from bench_helpers import bench_config, run

from inferlab.bench.outputs import write_outputs
from inferlab.bench.report_html import _meta_table


def test_sweep_report_opens_in_chromium_without_console_errors(mock_server, corpus,
                                                               tmp_path):
    require_chromium()
    url = mock_server(ttft_ms=20, itl_ms=3, max_running=8)
    config = bench_config(url, corpus, "sweep", max_seconds=0.8, sweep_size=4,
                          sync_max_seconds=0.5, max_concurrency=16, scrape=True,
                          data="prompt_tokens=16,output_tokens=8")
    result = run(config)
    assert [s.summary.info.kind for s in result.stages] == [
        "synchronous", "throughput", "constant", "constant"]
    assert result.server.available and "waiting" in result.server.series
    page = tmp_path / "report.html"
    write_outputs(result, (str(page),))
    html = page.read_text()
    # self-contained: nothing to fetch, scripts and styles inline
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html)
    assert "<link" not in html and "@import" not in html
    assert html.count("<svg") >= 10
    dom, messages = load_page(page)
    assert messages == []
    # the stage selector's script ran: only the first stage's charts are shown
    panels = re.findall(r'<div class="stage-panel charts" data-stage="(\d)"( hidden="")?', dom)
    assert [(stage, bool(hidden)) for stage, hidden in panels] == [
        ("0", False), ("1", True), ("2", True), ("3", True)]
    shot = tmp_path / "report.png"
    assert screenshot(page, shot) == []
    assert shot.stat().st_size > 20_000  # a blank page is a few kilobytes


def test_a_page_with_a_script_error_is_caught(tmp_path):
    """The check above would see an error: a page that throws is reported."""
    require_chromium()
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, messages = load_page(page)
    assert any("Uncaught ReferenceError" in m for m in messages)


def test_unset_settings_read_none():
    meta = {"target": "http://h:1", "model": "m", "endpoint": "chat", "profile": "sweep",
            "data": "d.jsonl", "tokenizer": None, "workers": 1, "started_at": "today",
            "slo": None, "calibration_seconds": 2.0}
    html = _meta_table(meta)
    for key in ("tokenizer", "slo"):
        assert f'<td class="l">{key}</td><td class="l">none</td>' in html
    assert "None" not in html


def test_scraping_turned_off_is_no_warning(mock_server, corpus, tmp_path):
    # --scrape-interval 0 is the user's choice: the report's server section says it is off
    config = bench_config(mock_server(), corpus, "synchronous", max_seconds=None,
                          max_requests=2, data="prompt_tokens=16,output_tokens=2")
    result = run(config)
    assert result.warnings == []
    page = tmp_path / "report.html"
    write_outputs(result, (str(page),))
    assert "scraping turned off (--scrape-interval 0)" in page.read_text()

"""The HTML report of one run: tables, and charts drawn as inline SVG."""

from __future__ import annotations

from html import escape

from inferlab.bench.config import NS_PER_S
from inferlab.bench.html_page import bullet_list, definitions, num, page, table
from inferlab.bench.metrics import DEFINITIONS, THROUGHPUT_DEFINITIONS, itl_ms, ttft_ms
from inferlab.bench.runner import StageResult
from inferlab.bench.session import RunResult
from inferlab.bench.summary import ok_values
from inferlab.bench.svg import Band, Series, empty_chart, histogram, line_chart

SUMMARY_HEADERS = [
    "stage", "asked", "sent req/s", "lag p99", "req/s", "output tok/s", "total tok/s",
    "concurrency",
    "ok / err / canc", "TTFT p50", "TTFT p95", "TTFT p99", "TTFT p99 from intended", "ITL p50",
    "ITL p95", "ITL p99", "TPOT p50", "E2E p50", "E2E p95", "goodput", "floor TTFT p50",
    "floor ITL p50"]


def render(result: RunResult) -> str:
    meta = result.meta
    parts = [f"<h1>inferlab bench: {escape(meta['model'])} at {escape(meta['target'])}</h1>",
             _meta_table(meta), bullet_list(meta.get("notes", []), "note"),
             bullet_list(result.warnings, "warn"),
             "<h2>Summary</h2>", _summary_table(result.stages),
             "<p class=\"note\">Latencies in ms, from the successful requests of each stage's "
             "window. The floor columns are the same load replayed against the built-in "
             "zero-latency mock: what the client itself adds.</p>"]
    if result.slo_search:
        parts.append(_slo_section(result))
    parts += ["<h2>Latency vs throughput</h2>", _sweep_charts(result.stages),
              "<h2>Distributions</h2>", _distributions(result.stages),
              "<h2>Over time</h2>", _time_charts(result),
              "<h2>Server metrics</h2>", _server_charts(result),
              "<h2>Definitions</h2>", definitions({**DEFINITIONS, **THROUGHPUT_DEFINITIONS})]
    return page(f"inferlab bench: {meta['model']}", "".join(parts))


def _meta_table(meta: dict) -> str:
    keys = ("target", "model", "endpoint", "profile", "data", "tokenizer", "workers",
            "started_at", "slo", "calibration_seconds")
    return table(["setting", "value"],
                 [[escape(k), escape("none" if meta.get(k) is None else str(meta[k]))]
                  for k in keys], left=2)  # "none", not Python's None, for an unset one


def _summary_table(stages: list[StageResult]) -> str:
    rows = []
    for stage in stages:
        s, m = stage.summary, stage.summary.metrics
        ok = {name: m[name]["ok"] for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")}
        floor = stage.floor
        rows.append([
            escape(s.info.label), num(s.info.rate, 2), num(s.sent_rate, 2),
            num(m["dispatch_lag_ms"]["ok"].p99, 2), num(s.request_throughput, 2),
            num(s.output_token_throughput), num(s.total_token_throughput),
            num(s.concurrency_mean),
            f"{s.counts['ok']} / {s.counts['error']} / {s.counts['cancelled']}",
            num(ok["ttft_ms"].median), num(ok["ttft_ms"].p95), num(ok["ttft_ms"].p99),
            num(m["ttft_intended_ms"]["ok"].p99),
            num(ok["itl_ms"].median, 2), num(ok["itl_ms"].p95, 2), num(ok["itl_ms"].p99, 2),
            num(ok["tpot_ms"].median, 2), num(ok["e2e_ms"].median), num(ok["e2e_ms"].p95),
            num(s.goodput, 2),
            num(floor.metrics["ttft_ms"]["ok"].median, 2) if floor else "-",
            num(floor.metrics["itl_ms"]["ok"].median, 3) if floor else "-"])
    return table(SUMMARY_HEADERS, rows)


def _slo_section(result: RunResult) -> str:
    search = result.slo_search
    assert search is not None
    rows = [[num(p.rate, 3), "pass" if p.passed else "fail"]
            + [num(p.observed.get(k)) if p.observed.get(k) is not None else "inf"
               for k in search.bounds] for p in search.probes]
    best = "none" if search.best_rate is None else f"{search.best_rate:.3f} req/s"
    bounds = ", ".join(f"{k} <= {v:g}" for k, v in search.bounds.items())
    return (f"<h2>SLO search</h2><p>Highest constant rate meeting {escape(bounds)} at "
            f"p{search.percentile:g}: <b>{escape(best)}</b>. {escape(search.note)}</p>"
            + table(["rate (req/s)", "result"] + [f"p{search.percentile:g} {k}"
                                                  for k in search.bounds], rows, left=0))


def _sweep_charts(stages: list[StageResult]) -> str:
    ordered = sorted(stages, key=lambda s: s.summary.request_throughput)
    xs = [s.summary.request_throughput for s in ordered]
    charts = []
    for metric, title in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "End-to-end")):
        series = [Series(stat, xs, [s.summary.metrics[metric]["ok"].get(stat) for s in ordered],
                         markers=True) for stat in ("median", "p95", "p99")]
        charts.append(line_chart(f"{title} vs throughput", series, "requests/s",
                                 f"{metric.removesuffix('_ms')} (ms)"))
    return f'<div class="charts">{"".join(charts)}</div>'


def _distributions(stages: list[StageResult]) -> str:
    options = "".join(f'<option value="{i}">{escape(s.summary.info.label)}</option>'
                      for i, s in enumerate(stages))
    panels = []
    for i, stage in enumerate(stages):
        ttft = ok_values(stage.summary, stage.records, ttft_ms)
        itl = ok_values(stage.summary, stage.records, itl_ms)
        panels.append(
            f'<div class="stage-panel charts" data-stage="{i}">'
            + histogram(f"TTFT, {stage.summary.info.label}", {"TTFT": ttft}, "ms")
            + histogram(f"ITL per request, {stage.summary.info.label}", {"ITL": itl}, "ms")
            + "</div>")
    return (f'<label>stage <select id="stage-select">{options}</select></label>'
            + "".join(panels))


def _stage_bands(stages: list[StageResult]) -> list[Band]:
    return [Band(s.summary.info.start_ns / NS_PER_S, s.summary.end_ns / NS_PER_S, s.summary.info.label)
            for s in stages]


def _time_charts(result: RunResult) -> str:
    tl, bands = result.timeline, _stage_bands(result.stages)
    throughput = line_chart("Throughput over time", [
        Series("output tok/s", tl.t_s, tl.output_tokens_per_s)], "seconds", "tokens/s", bands)
    requests = line_chart("Requests over time", [
        Series("completed req/s", tl.t_s, tl.completed_per_s),
        Series("errors/s", tl.t_s, tl.errors_per_s)], "seconds", "requests/s", bands)
    concurrency = line_chart("Concurrency over time", [
        Series("in flight", tl.t_s, tl.concurrency)], "seconds", "requests", bands)
    return f'<div class="charts">{throughput}{requests}{concurrency}</div>'


def _server_charts(result: RunResult) -> str:
    server = result.server
    if not server.available:
        return empty_chart("Server metrics", server.note or "not available")
    bands = _stage_bands(result.stages)
    queue = [Series(name, server.t_s, server.series[name], markers=len(server.t_s) < 40)
             for name in ("running", "waiting") if name in server.series]
    cache = [Series("KV-cache usage", server.t_s, server.series["kv_cache_usage"])
             ] if "kv_cache_usage" in server.series else []
    for name, rate in (("prefix-cache hit rate", server.prefix_hit_rate()),
                       ("draft acceptance rate", server.draft_acceptance_rate())):
        if rate:
            cache.append(Series(name, server.t_s, rate))
    charts = [line_chart("Server queue", queue, "seconds", "requests", bands) if queue
              else empty_chart("Server queue", "no running/waiting metrics"),
              line_chart("Server caches and drafts", cache, "seconds", "fraction", bands) if cache
              else empty_chart("Server caches and drafts", "no KV/prefix cache metrics")]
    return f'<div class="charts">{"".join(charts)}</div>'

"""The CSV report: one row per stage, every aggregate as a column (successful requests)."""

from __future__ import annotations

import csv
import io

from inferlab.bench.session import RunResult
from inferlab.bench.stats import STAT_NAMES
from inferlab.bench.summary import StageSummary

LATENCY_COLUMNS = ("ttft_ms", "ttft_intended_ms", "itl_ms", "tpot_ms", "e2e_ms",
                   "e2e_intended_ms", "dispatch_lag_ms", "itl_token_ms", "chunk_gap_ms")
FLOOR_COLUMNS = (("ttft_ms", "median"), ("ttft_ms", "p99"), ("itl_ms", "median"),
                 ("itl_ms", "p99"), ("dispatch_lag_ms", "p99"))


def header() -> list[str]:
    columns = ["stage", "label", "kind", "asked_rate", "scheduled_rate", "sent_rate",
               "stop_reason", "window_s", "ok", "error", "cancelled", "request_throughput",
               "output_token_throughput", "total_token_throughput", "goodput", "slo_fraction",
               "concurrency_mean", "concurrency_max"]
    columns += [f"{m}_{s}" for m in LATENCY_COLUMNS for s in STAT_NAMES]
    columns += [f"floor_{m}_{s}" for m, s in FLOOR_COLUMNS] + ["floor_sent_rate"]
    return columns


def row(summary: StageSummary, floor: StageSummary | None) -> list[object]:
    info = summary.info
    values: list[object] = [
        info.stage, info.label, info.kind, info.rate, summary.scheduled_rate, summary.sent_rate,
        info.stop_reason, summary.window_s, summary.counts["ok"], summary.counts["error"],
        summary.counts["cancelled"], summary.request_throughput,
        summary.output_token_throughput, summary.total_token_throughput, summary.goodput,
        summary.slo_fraction, summary.concurrency_mean, summary.concurrency_max]
    values += [summary.metrics[m]["ok"].get(s) for m in LATENCY_COLUMNS for s in STAT_NAMES]
    values += [floor.metrics[m]["ok"].get(s) if floor else None for m, s in FLOOR_COLUMNS]
    values.append(floor.sent_rate if floor else None)
    return ["" if v is None else v for v in values]


def render_csv(result: RunResult) -> str:
    text = io.StringIO()
    writer = csv.writer(text)  # rows end in CRLF, as RFC 4180 has them
    writer.writerow(header())
    for stage in result.stages:
        writer.writerow(row(stage.summary, stage.floor))
    return text.getvalue()

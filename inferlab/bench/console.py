"""The summary printed at the end of a run."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferlab.bench.html_page import num
from inferlab.bench.metrics import DEFINITIONS, THROUGHPUT_DEFINITIONS
from inferlab.bench.session import RunResult

SHOWN = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1; a reader that left (`| head`) is no error: inferlab.cli.main says so
        raise BrokenPipeError


def stdout_console() -> Console:
    # piped to a file, rich would wrap at 80 columns: the report tables are wider
    return _StdoutConsole() if sys.stdout.isatty() else _StdoutConsole(width=200)


def load_table(result: RunResult) -> Table:
    """What each stage asked and achieved: rates, throughput, outcomes."""
    # the model name and URL are the user's: as markup, "mistral[awq]" would lose "[awq]"
    meta = result.meta
    table = Table(title=escape(f"{meta['model']} at {meta['target']} ({meta['profile']}): load"))
    for name in ("stage", "asked", "sent req/s", "lag p99 ms", "req/s", "out tok/s",
                 "total tok/s", "concurrency", "ok/err/canc", "goodput"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    for stage in result.stages:
        s = stage.summary
        lag = s.metrics["dispatch_lag_ms"]["ok"].p99
        table.add_row(s.info.label, num(s.info.rate, 2), num(s.sent_rate, 2), num(lag, 2),
                      num(s.request_throughput, 2), num(s.output_token_throughput),
                      num(s.total_token_throughput), num(s.concurrency_mean),
                      f"{s.counts['ok']}/{s.counts['error']}/{s.counts['cancelled']}",
                      num(s.goodput, 2))
    return table


def latency_table(result: RunResult) -> Table:
    """Latency percentiles of successful requests, with the client's floor beside them."""
    table = Table(title="latency (ms)")
    for name in ("stage", "TTFT p50/p95/p99", "TTFT p99 from intended", "ITL p50/p95/p99",
                 "TPOT p50", "E2E p50/p95", "floor TTFT/ITL p50"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    for stage in result.stages:
        m = stage.summary.metrics
        ttft, itl = m["ttft_ms"]["ok"], m["itl_ms"]["ok"]
        e2e, tpot = m["e2e_ms"]["ok"], m["tpot_ms"]["ok"]
        floor = "-"
        if stage.floor is not None:
            f = stage.floor.metrics
            floor = f"{num(f['ttft_ms']['ok'].median, 2)} / {num(f['itl_ms']['ok'].median, 3)}"
        table.add_row(stage.summary.info.label,
                      f"{num(ttft.median)}/{num(ttft.p95)}/{num(ttft.p99)}",
                      num(m["ttft_intended_ms"]["ok"].p99),
                      f"{num(itl.median, 2)}/{num(itl.p95, 2)}/{num(itl.p99, 2)}",
                      num(tpot.median, 2), f"{num(e2e.median)}/{num(e2e.p95)}", floor)
    return table


def print_summary(result: RunResult, console: Console) -> None:
    console.print(load_table(result))
    console.print(latency_table(result))
    if result.slo_search is not None:
        search = result.slo_search
        best = "no rate" if search.best_rate is None else f"{search.best_rate:.3f} req/s"
        console.print(f"SLO search ({search.bounds} at p{search.percentile:g}): {best} "
                      f"{search.note}")
    # notes name files and warnings quote server errors ("... [/etc/policy]"): not markup
    for note in result.meta.get("notes", []):
        console.print(f"[dim]note: {escape(note)}[/]")
    for warning in result.warnings:
        console.print(f"[yellow]warning: {escape(warning)}[/]")
    console.print("[dim]Latencies in ms over successful requests. The floor is the same "
                  "load against a zero-latency mock: the client's own share.[/]")
    for name in (*SHOWN, "ttft_intended_ms", "dispatch_lag_ms"):
        console.print(f"[dim]{name}: {DEFINITIONS[name]}[/]")
    for name in ("request_throughput", "output_token_throughput", "goodput"):
        console.print(f"[dim]{name}: {THROUGHPUT_DEFINITIONS[name]}[/]")

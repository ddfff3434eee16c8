"""The live display during a run (rich), or silence."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.live import Live
from rich.table import Table

from inferlab.bench.metrics import itl_ms, ttft_ms
from inferlab.bench.runner import Snapshot
from inferlab.bench.summary import StageSummary


class NullProgress:
    def stage_started(self) -> None:
        pass

    def update(self, snapshot: Snapshot) -> None:
        pass

    def stage_finished(self, summary: StageSummary) -> None:
        pass


class LiveProgress:
    """One line per finished stage, and a live table for the running one."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live: Live | None = None

    def stage_started(self) -> None:
        self.live = Live(console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def update(self, snapshot: Snapshot) -> None:
        if self.live is not None:
            self.live.update(_table(snapshot))

    def stage_finished(self, summary: StageSummary) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        c = summary.counts
        ttft = summary.metrics["ttft_ms"]["ok"].median
        self.console.print(
            f"[bold]{summary.info.label}[/]: {c['ok']} ok, {c['error']} errors, "
            f"{c['cancelled']} cancelled; {summary.request_throughput:.2f} req/s, "
            f"{summary.output_token_throughput:.1f} tok/s, median TTFT "
            f"{'-' if ttft is None else f'{ttft:.1f} ms'} ({summary.info.stop_reason})")


def _table(s: Snapshot) -> Table:
    table = Table(title=f"stage {s.label}", show_header=True, expand=False)
    for name in ("elapsed", "sent", "in flight", "ok", "errors", "cancelled",
                 "TTFT p50 (recent)", "ITL p50 (recent)"):
        table.add_column(name, justify="right")
    limit = f"/{s.max_seconds:g}s" if s.max_seconds else ""
    sent_limit = f"/{s.max_requests}" if s.max_requests else ""
    recent_ok = [r for r in s.recent if r.outcome == "ok"]
    table.add_row(f"{s.elapsed_s:.1f}s{limit}", f"{s.sent}{sent_limit}", str(s.in_flight),
                  str(s.counts["ok"]), str(s.counts["error"]), str(s.counts["cancelled"]),
                  _median_ms([ttft_ms(r) for r in recent_ok]),
                  _median_ms([itl_ms(r) for r in recent_ok]))
    return table


def _median_ms(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.median(present):.1f} ms" if present else "-"

"""Calibrate `inferlab bench` against its own mock server: the client's floor.

Three measurements, each against a mock in its own process on this machine:

1. floor: a zero-latency mock at fixed request rates. The TTFT and ITL the client reports
   there are what it adds itself (plus the mock's own share on the same machine); and the
   rate closed loops of 1, 16 and 64 streams reach against it (the client at full speed).
2. max rate: constant request rates against the zero-latency mock, doubling until the
   client no longer keeps its schedule (achieved send rate off by more than 2%, or p99
   dispatch lag over 10 ms), with 1 and 2 worker processes.
3. accuracy (the issue's targets): a mock injecting TTFT 50 ms and 10 ms per token; the
   reported median TTFT and ITL must be within 2 ms of that at 1, 16 and 64 streams
   (streams started together, and spread over one ITL), and a constant 50 req/s must be
   achieved within 2%.

Run: .venv/bin/python benchmarks/bench_client_floor.py [--seconds 3] [--json out.json]
The machine's load average is printed first: on a shared machine, read the figures with it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from workloads import bounded_float, bounded_int, output_file, script_parser

from inferlab.bench.config import (
    MAX_SECONDS,
    MAX_WORKERS,
    BenchConfig,
    DataConfig,
    LoadConfig,
    MeasureConfig,
    Span,
    StageLimits,
    TargetConfig,
)
from inferlab.bench.mock import MockConfig
from inferlab.bench.mock_process import MockProcess
from inferlab.bench.progress import NullProgress
from inferlab.bench.session import run_benchmark
from inferlab.bench.summary import StageSummary
from inferlab.shared_data import WIKITEXT_TEST

TTFT_MS, ITL_MS = 50.0, 10.0
OUTPUT_TOKENS = 32
RATE_TOLERANCE, LAG_LIMIT_MS, ACCURACY_MS = 0.02, 10.0, 2.0
WARMUP_S = 0.5  # each stage's first half second is left out: fresh connections, cold paths


def corpus_file() -> str:
    """Prompt text: WikiText-2 beside the project, else a generated file."""
    wiki = WIKITEXT_TEST
    if wiki.is_file():
        return str(wiki)
    path = Path(tempfile.gettempdir()) / "inferlab_floor_corpus.txt"
    path.write_text(" ".join(f"word{i % 997}" for i in range(50_000)))
    return str(path)


def config(url: str, profile: str, rates: tuple[float, ...], seconds: float, workers: int,
           ramp_up_s: float = 0.0, max_concurrency: int | None = None) -> BenchConfig:
    return BenchConfig(
        target=TargetConfig(url),
        load=LoadConfig(profile, rates, max_concurrency=max_concurrency, ramp_up_s=ramp_up_s),
        limits=StageLimits(max_seconds=seconds, drain_seconds=5.0, request_timeout_s=30.0,
                           warmup=Span(seconds=WARMUP_S)),
        data=DataConfig(f"prompt_tokens=64,output_tokens={OUTPUT_TOKENS}", corpus_file()),
        measure=MeasureConfig(workers=workers, calibration_seconds=0, scrape_interval_s=None))


def stat(summary: StageSummary, metric: str, name: str) -> float | None:
    return summary.metrics[metric]["ok"].get(name)


FLOOR_RATES = (10.0, 50.0, 100.0, 200.0)


def floor(seconds: float) -> tuple[list[dict], list[dict]]:
    """(floor at fixed rates, closed-loop rates at 1/16/64 streams)."""
    with MockProcess(MockConfig()) as mock:
        paced = run_benchmark(config(mock.url, "constant", FLOOR_RATES, seconds, 1),
                              NullProgress())
        closed = run_benchmark(config(mock.url, "concurrent", (1, 16, 64), seconds, 1),
                               NullProgress())
    rates = []
    for stage in paced.stages:
        s = stage.summary
        rates.append({"req_per_s": stage.spec.rate,
                      "ttft_ms_p50": stat(s, "ttft_ms", "median"),
                      "ttft_ms_p99": stat(s, "ttft_ms", "p99"),
                      "itl_ms_p50": stat(s, "itl_ms", "median"),
                      "itl_ms_p99": stat(s, "itl_ms", "p99"),
                      "lag_ms_p50": stat(s, "dispatch_lag_ms", "median"),
                      "lag_ms_p99": stat(s, "dispatch_lag_ms", "p99")})
    loops = [{"streams": int(stage.spec.rate or 0),
              "req_per_s": round(stage.summary.request_throughput, 1),
              "out_tok_per_s": round(stage.summary.output_token_throughput),
              "ttft_ms_p50": stat(stage.summary, "ttft_ms", "median")}
             for stage in closed.stages]
    return rates, loops


def max_rate(seconds: float, workers: int, start: float = 50.0,
             limit: float = 6400.0) -> tuple[float, list[dict]]:
    """Highest doubling rate at which the client still keeps the schedule."""
    best, rows, rate = 0.0, [], start
    with MockProcess(MockConfig()) as mock:
        while rate <= limit:
            result = run_benchmark(config(mock.url, "constant", (rate,), seconds, workers),
                                   NullProgress())
            s = result.stages[0].summary
            lag_p99 = stat(s, "dispatch_lag_ms", "p99") or 0.0
            error = (s.sent_rate or 0.0) / rate - 1
            kept = abs(error) <= RATE_TOLERANCE and lag_p99 <= LAG_LIMIT_MS
            rows.append({"workers": workers, "asked": rate, "sent": round(s.sent_rate or 0, 1),
                         "error_pct": round(100 * error, 2), "lag_ms_p99": round(lag_p99, 2),
                         "ttft_ms_p50": stat(s, "ttft_ms", "median"), "kept": kept})
            if not kept:
                break
            best, rate = rate, rate * 2
    return best, rows


def accuracy(seconds: float) -> tuple[list[dict], dict]:
    rows = []
    with MockProcess(MockConfig(ttft_ms=TTFT_MS, itl_ms=ITL_MS)) as mock:
        for ramp_up_s in (0.0, ITL_MS / 1000):
            result = run_benchmark(config(mock.url, "concurrent", (1, 16, 64), seconds, 1,
                                          ramp_up_s), NullProgress())
            for stage in result.stages:
                s = stage.summary
                ttft, itl = stat(s, "ttft_ms", "median"), stat(s, "itl_ms", "median")
                rows.append({
                    "streams": int(stage.spec.rate or 0), "ramp_up_s": ramp_up_s,
                    "ttft_ms_p50": ttft, "ttft_ms_mean": stat(s, "ttft_ms", "mean"),
                    "itl_ms_p50": itl, "itl_ms_mean": stat(s, "itl_ms", "mean"),
                    "pass": (ttft is not None and itl is not None
                             and abs(ttft - TTFT_MS) <= ACCURACY_MS
                             and abs(itl - ITL_MS) <= ACCURACY_MS)})
        result = run_benchmark(config(mock.url, "constant", (50.0,), seconds, 1),
                               NullProgress())
    s = result.stages[0].summary
    error = (s.sent_rate or 0.0) / 50.0 - 1
    rate = {"asked": 50.0, "sent": s.sent_rate, "error_pct": 100 * error,
            "pass": abs(error) <= RATE_TOLERANCE}
    return rows, rate


def table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--seconds", type=bounded_float(WARMUP_S, MAX_SECONDS), default=3.0,
                        help=f"length of each stage, over the {WARMUP_S:g} s warm-up left out of "
                             "its figures")
    parser.add_argument("--max-workers", type=bounded_int(1, MAX_WORKERS), default=2)
    parser.add_argument("--json", type=output_file, help="also write the figures to this file")
    args = parser.parse_args()
    started = time.monotonic()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}, python {sys.version.split()[0]}\n")
    figures: dict = {"cpus": os.cpu_count(), "load_average": load}
    figures["floor"], figures["closed_loop"] = floor(args.seconds)
    print("## Client floor (zero-latency mock, 64-token prompts, "
          f"{OUTPUT_TOKENS}-token outputs, 1 worker)\n\n" + table(figures["floor"]) + "\n")
    print("## Closed loops against the zero-latency mock (the client at full speed)\n\n"
          + table(figures["closed_loop"]) + "\n")
    figures["max_rate"] = {}
    rows = []
    for workers in range(1, args.max_workers + 1):
        best, tried = max_rate(args.seconds, workers)
        figures["max_rate"][workers] = best
        rows += tried
    print(f"## Max rate kept within {RATE_TOLERANCE:.0%} (p99 dispatch lag <= "
          f"{LAG_LIMIT_MS:g} ms)\n\n" + table(rows) + "\n")
    for workers, best in figures["max_rate"].items():
        print(f"max achievable rate with {workers} worker(s): {best:g} req/s")
    acc_rows, rate = accuracy(args.seconds)
    figures["accuracy"], figures["rate_50"] = acc_rows, rate
    print(f"\n## Accuracy: mock TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms (target: within "
          f"{ACCURACY_MS:g} ms)\n\n" + table(acc_rows) + "\n")
    sent = "none" if rate["sent"] is None else f"{rate['sent']:.3f}"  # too short to fit a rate
    print(f"constant 50 req/s: sent {sent} req/s ({rate['error_pct']:+.2f}%) "
          f"{'PASS' if rate['pass'] else 'FAIL'}")
    print(f"\ntook {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

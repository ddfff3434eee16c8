"""Helpers for the benchmark tests (fixtures are in conftest.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from inferlab.bench.config import (
    BenchConfig,
    DataConfig,
    LoadConfig,
    MeasureConfig,
    Span,
    StageLimits,
    TargetConfig,
)
from inferlab.bench.progress import NullProgress
from inferlab.bench.records import RequestRecord
from inferlab.bench.report_json import LoadedStage
from inferlab.bench.session import RunResult, run_benchmark
from inferlab.bench.summary import StageInfo, summarize

MS = 1_000_000


def bench_config(url: str, corpus: Path, profile: str = "constant",
                 rates: tuple[float, ...] = (), *, data: str = "prompt_tokens=32,output_tokens=8",
                 calibration_seconds: float = 0.0, scrape: bool = False, chat: bool = False,
                 tokenizer: str | None = None, **limits: object) -> BenchConfig:
    """A small run's config; limits default to two seconds per stage."""
    settings: dict = {"max_seconds": 2.0, "drain_seconds": 3.0, "request_timeout_s": 10.0}
    settings.update(limits)
    load_keys = {"max_concurrency", "sweep_size", "sync_max_seconds", "ramp_up_s",
                 "slo_search", "slo_search_steps"}
    load = {k: settings.pop(k) for k in list(settings) if k in load_keys}
    slo = settings.pop("slo", None)
    return BenchConfig(
        target=TargetConfig(url, chat=chat), load=LoadConfig(profile, rates, **load),
        limits=StageLimits(**settings),
        data=DataConfig(data, str(corpus), tokenizer),
        measure=MeasureConfig(workers=1, calibration_seconds=calibration_seconds,
                              scrape_interval_s=0.25 if scrape else None),
        slo=slo)


def with_workers(config: BenchConfig, workers: int) -> BenchConfig:
    return dataclasses.replace(config, measure=dataclasses.replace(config.measure,
                                                                   workers=workers))


def run(config: BenchConfig) -> RunResult:
    return run_benchmark(config, NullProgress())


def closed_stdout_exit_code(argv: list[str]) -> int:
    """Run `inferlab ARGV | true`: the reader of stdout is gone before the first byte."""
    proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    return proc.returncode


def synthetic_stage(ttfts_ms: list[float], errors: int = 0, label: str = "constant@20/s",
                    slo_ttft_ms: float | None = None) -> LoadedStage:
    """A stage of requests 50 ms apart with the given TTFTs, then `errors` failures."""
    records = []
    for i, ttft in enumerate([*ttfts_ms, *[None] * errors]):
        start = i * 50 * MS
        first = None if ttft is None else start + round(ttft * MS)
        end = start + 5 * MS if first is None else first + 10 * MS
        records.append(RequestRecord(
            stage=0, index=i, outcome="ok" if first else "error",
            error="" if first else "HTTP 500: boom", status=200 if first else 500,
            intended_ns=start, start_ns=start, first_token_ns=first, end_ns=end,
            chunk_ns=[first, end] if first else [], chunk_tokens=[1, 1] if first else [],
            output_tokens=2 if first else 0, output_tokens_source="usage"))
    info = StageInfo(0, label, "constant", 20.0, 0, "max_requests", len(records))
    slo = {"ttft_ms": slo_ttft_ms} if slo_ttft_ms else None
    return LoadedStage(label, summarize(info, records, Span(), Span(), slo), None, records)

"""Helpers for the benchmark tests (fixtures are in conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inferlab.bench.config import (
    BenchConfig,
    DataConfig,
    LoadConfig,
    MeasureConfig,
    StageLimits,
    TargetConfig,
)
from inferlab.bench.progress import NullProgress
from inferlab.bench.session import RunResult, run_benchmark


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

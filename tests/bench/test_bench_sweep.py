"""Sweep and SLO search decisions, on a stand-in runner whose server model is known:
requests take 100 ms end to end, and the TTFT jumps from 20 ms to 300 ms above 40 req/s."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from inferlab.bench.config import LoadConfig, Span, StageLimits
from inferlab.bench.profiles import StageSpec
from inferlab.bench.records import RequestRecord
from inferlab.bench.runner import StageResult
from inferlab.bench.summary import StageInfo, summarize
from inferlab.bench.sweep import run_profile
from inferlab.cli import main
from inferlab.errors import InferlabError

MS = 1_000_000
KNEE_RATE = 40.0
SYNC_RATE, THROUGHPUT_RATE = 10.0, 80.0


def records_at(rate: float, ttft_ms: float, seconds: float = 2.0) -> list[RequestRecord]:
    gap_ms = 1000 / rate
    out = []
    for i in range(int(seconds * rate)):
        start = round(i * gap_ms * MS)
        out.append(RequestRecord(
            stage=0, index=i, outcome="ok", error="", status=200, intended_ns=start,
            start_ns=start, first_token_ns=start + round(ttft_ms * MS),
            end_ns=start + 100 * MS, chunk_ns=[start + round(ttft_ms * MS)], chunk_tokens=[1],
            output_tokens=1, output_tokens_source="usage"))
    return out


@dataclass
class ModelRunner:
    """Runs nothing: answers each stage from the server model above."""

    interrupt_after: int | None = None
    dead_throughput: bool = False  # the throughput stage completes no request
    ran: list[StageSpec] = field(default_factory=list)
    interrupted: bool = False

    def run(self, spec: StageSpec, stage: int) -> StageResult:
        self.ran.append(spec)
        if spec.kind == "synchronous":
            rate = SYNC_RATE
        elif spec.kind == "throughput":
            rate = THROUGHPUT_RATE
        else:
            rate = spec.rate or 0.0
        ttft = 20.0 if rate <= KNEE_RATE else 300.0
        records = [] if self.dead_throughput and spec.kind == "throughput" else \
            records_at(rate, ttft)
        info = StageInfo(stage, spec.label, spec.kind, spec.rate, 0, "max_seconds",
                         len(records))
        if self.interrupt_after is not None and len(self.ran) >= self.interrupt_after:
            self.interrupted = True
        return StageResult(spec, summarize(info, records, Span(), Span(), None), records)


LIMITS = StageLimits(max_seconds=30.0)


def test_sweep_size_counts_every_stage_and_ends_at_the_throughput_rate():
    # guidellm's sweep_size: 5 stages in all, the last 3 constant rates evenly spaced from
    # the synchronous rate (excluded) to the throughput rate (included)
    runner = ModelRunner()
    results, search = run_profile(runner, LoadConfig("sweep", sweep_size=5), LIMITS, None)
    assert search is None
    assert [s.kind for s in runner.ran] == ["synchronous", "throughput"] + ["constant"] * 3
    # the request throughput of each model stage is its rate (2 s of requests, 100 ms each)
    low, high = (r.summary.request_throughput for r in results[:2])
    assert low == pytest.approx(SYNC_RATE, rel=0.06) and high == pytest.approx(80, rel=0.06)
    rates = [s.rate for s in runner.ran[2:]]
    assert rates == pytest.approx([low + (high - low) / 3, low + (high - low) * 2 / 3, high])
    assert rates[-1] == high
    # the synchronous stage is bounded in time so it never dominates the run
    assert runner.ran[0].limits.max_seconds == 15.0 and runner.ran[1].limits.max_seconds == 30


def test_the_default_sweep_runs_guidellms_ten_stages():
    runner = ModelRunner()
    run_profile(runner, LoadConfig("sweep"), LIMITS, None)
    assert [s.kind for s in runner.ran] == ["synchronous", "throughput"] + ["constant"] * 8


def test_a_sweep_of_two_stages_runs_no_constant_rate_and_warns_of_none():
    runner = ModelRunner(dead_throughput=True)
    results, _ = run_profile(runner, LoadConfig("sweep", sweep_size=2), LIMITS, None)
    assert [s.kind for s in runner.ran] == ["synchronous", "throughput"]
    assert not any("skipped" in w for r in results for w in r.summary.warnings)


@pytest.mark.parametrize("size", [1, 0, -3])
def test_a_sweep_smaller_than_its_two_measuring_stages_is_refused(size):
    with pytest.raises(InferlabError, match="--sweep-size counts a sweep's stages in all"):
        LoadConfig("sweep", sweep_size=size)


def test_slo_search_bisects_to_the_knee():
    runner = ModelRunner()
    load = LoadConfig("sweep", sweep_size=4, slo_search=True, slo_search_steps=5)
    results, search = run_profile(runner, load, LIMITS, {"ttft_ms": 100.0})
    assert search is not None
    constant_rates = [s.rate for s in runner.ran if s.kind == "constant"]
    assert len(constant_rates) == 2 + 5
    assert KNEE_RATE - 3 < search.best_rate <= KNEE_RATE
    for probe in search.probes:
        assert probe.passed == (probe.rate <= KNEE_RATE)
    assert len(results) == len(runner.ran)


def test_slo_search_when_even_one_request_at_a_time_fails():
    runner = ModelRunner()
    load = LoadConfig("sweep", sweep_size=3, slo_search=True)
    _, search = run_profile(runner, load, LIMITS, {"ttft_ms": 5.0})
    assert search.best_rate is None and "not met" in search.note
    assert len(runner.ran) == 3  # no bisection stage was run


def test_interrupt_stops_further_stages():
    runner = ModelRunner(interrupt_after=2)
    results, _ = run_profile(runner, LoadConfig("sweep", sweep_size=4), LIMITS, None)
    assert len(results) == 2


def test_a_sweep_with_no_rate_range_says_why_it_ran_no_constant_stage():
    runner = ModelRunner(dead_throughput=True)
    results, _ = run_profile(runner, LoadConfig("sweep", sweep_size=3), LIMITS, None)
    assert [s.kind for s in runner.ran] == ["synchronous", "throughput"]
    assert any("constant stages were skipped" in w and "0 req/s" in w
               for w in results[1].summary.warnings)


def test_the_cli_refuses_a_sweep_of_one_stage_in_one_line(capsys):
    argv = ["bench", "--target", "http://127.0.0.1:9", "--profile", "sweep", "--sweep-size",
            "1", "--max-seconds", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--sweep-size counts a sweep's stages in all" in err and "got 1" in err
    assert err.count("\n") == 1 and "Traceback" not in err

"""Running a profile's stages: fixed ones, and those whose later stages depend on earlier
ones (the sweep and the SLO search); and what the stages' cut requests say of the server."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from inferlab.bench.config import LoadConfig, StageLimits
from inferlab.bench.profiles import (
    StageSpec,
    bisect_next,
    fixed_stages,
    search_bounds,
    sweep_rates,
)
from inferlab.bench.runner import StageResult, StageRunner
from inferlab.bench.summary import measured, slo_percentile_check

SLO_PERCENTILE = 95.0
EARLY_STOPS = ("interrupted", "max_error_rate")  # a stop that cancels what is in flight


@dataclass
class SloProbe:
    rate: float  # constant req/s tried
    passed: bool
    observed: dict[str, float | None]  # p95 of each bounded metric (None: infinite)


@dataclass
class SloSearch:
    bounds: dict[str, float]
    percentile: float
    probes: list[SloProbe] = field(default_factory=list)
    best_rate: float | None = None  # highest rate that met the SLO; None: none did
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def run_profile(runner: StageRunner, load: LoadConfig, limits: StageLimits,
                slo: dict[str, float] | None) -> tuple[list[StageResult], SloSearch | None]:
    search = None
    if load.profile != "sweep":
        results = []
        for i, spec in enumerate(fixed_stages(load, limits)):
            if runner.interrupted:
                break
            results.append(runner.run(spec, i))
    else:
        results = _sweep(runner, load, limits)
        if load.slo_search and slo and len(results) >= 2 and not runner.interrupted:
            search = _slo_search(runner, load, limits, slo, results)
    for result in results:
        result.summary.warnings += _drain_warnings(result)
    return results, search


def _drain_warnings(result: StageResult) -> list[str]:
    """Requests the server had not finished when the drain after --max-seconds ended, and
    scheduled sends the client never made.

    Both count as cancelled (guidellm's "incomplete"), not as errors; said alone, the count
    hides that the server stopped answering the ones, and that it never saw the others:
    --max-concurrency held them back until --max-seconds ended.
    """
    if result.summary.info.stop_reason in EARLY_STOPS:
        return []  # the early stop, not the drain, cancelled what was in flight
    cancelled = [r for r in result.records if r.outcome == "cancelled"]
    unanswered = sum(r.start_ns is not None for r in cancelled)
    never_sent = len(cancelled) - unanswered
    if not unanswered:
        return [_never_sent_warning(result, never_sent)] if never_sent else []
    were = "request was" if unanswered == 1 else "requests were"
    drain_s = result.spec.limits.drain_seconds
    warning = (f"{unanswered} {were} still unanswered when the drain ended, {drain_s:g} s "
               "(--drain-seconds) after --max-seconds: the server stopped answering them, "
               "or needs longer than the drain; they count as cancelled, not as errors")
    if never_sent:
        warning += (f" (the other {never_sent} cancelled were scheduled sends never made: "
                    f"{_held_back_by(result)})")
    return [warning]


def _never_sent_warning(result: StageResult, never_sent: int) -> str:
    were = "send was" if never_sent == 1 else "sends were"
    return (f"{never_sent} scheduled {were} never made ({_held_back_by(result)}); they count "
            "as cancelled, and the server never saw them")


def _held_back_by(result: StageResult) -> str:
    """Why a stage that ran to its end left sends unmade: the worker drops only those an
    in-flight cap held back past --max-seconds."""
    cap = result.spec.max_concurrency
    if cap is None:
        return "the stage ended before the client sent them"
    return f"--max-concurrency {cap} held them back until --max-seconds ended"


def _sweep(runner: StageRunner, load: LoadConfig, limits: StageLimits) -> list[StageResult]:
    """Synchronous (time-bounded), throughput, then constant rates from the one's rate up to
    the other's: --sweep-size stages in all."""
    sync_seconds = min(limits.max_seconds or math.inf, load.sync_max_seconds)
    sync = runner.run(StageSpec("synchronous", None, None,
                                replace(limits, max_seconds=sync_seconds)), 0)
    results = [sync]
    if runner.interrupted:
        return results
    results.append(runner.run(StageSpec("throughput", None, load.max_concurrency, limits), 1))
    sync_rate, throughput_rate = (r.summary.request_throughput for r in results)
    if runner.interrupted:
        return results
    rates = sweep_rates(sync_rate, throughput_rate, load.sweep_size)
    if rates and (sync_rate <= 0 or throughput_rate <= 0):  # no rate to sweep between
        results[-1].summary.warnings.append(
            "the sweep's constant stages were skipped: the synchronous or the throughput "
            "stage measured 0 req/s (no successful request), so there is no range of "
            "rates to sweep")
        return results
    for i, rate in enumerate(rates):
        if runner.interrupted:
            break
        results.append(runner.run(StageSpec("constant", rate, load.max_concurrency, limits,
                                             load.seed + i), len(results)))
    return results


def _slo_search(runner: StageRunner, load: LoadConfig, limits: StageLimits,
                bounds: dict[str, float], results: list[StageResult]) -> SloSearch:
    """Bisection over constant rates for the highest one meeting the SLO at p95."""
    search = SloSearch(bounds, SLO_PERCENTILE)
    sync = results[0]
    sync_ok, _ = slo_percentile_check(measured(sync.summary, sync.records), bounds,
                                      SLO_PERCENTILE)
    if not sync_ok:
        search.note = "the SLO is not met even one request at a time"
        return search
    ceiling = results[1].summary.request_throughput  # no constant rate can beat it
    tested = [(r.spec.rate, _probe(search, r)) for r in results
              if r.spec.kind == "constant" and r.spec.rate is not None]
    floor_rate = results[0].summary.request_throughput
    for _ in range(load.slo_search_steps):
        passing, failing = search_bounds(tested)
        if failing is None:
            if any(rate >= ceiling for rate, _ in tested):
                break  # passes at the server's maximum rate
            rate = ceiling
        else:
            rate = bisect_next(max(passing, floor_rate), failing)
        if runner.interrupted:
            break
        result = runner.run(StageSpec("constant", rate, load.max_concurrency, limits,
                                      load.seed + len(results)), len(results))
        results.append(result)
        tested.append((rate, _probe(search, result)))
    passing, _ = search_bounds(tested)
    search.best_rate = passing if passing > 0 else floor_rate
    return search


def _probe(search: SloSearch, result: StageResult) -> bool:
    passed, observed = slo_percentile_check(measured(result.summary, result.records),
                                            search.bounds, search.percentile)
    search.probes.append(SloProbe(result.spec.rate or 0.0, passed,
                                  {k: (None if math.isinf(v) else v) for k, v in observed.items()}))
    return passed

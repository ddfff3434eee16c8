"""One `inferlab bench` run from config to result: workload, workers, stages, scraping,
self-calibration, and the run-wide warnings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from inferlab.bench.caveats import run_warnings
from inferlab.bench.client import Target, now_ns
from inferlab.bench.config import BenchConfig, Span
from inferlab.bench.interrupts import Interrupts
from inferlab.bench.mock import UNLIMITED_MODEL_LEN, MockConfig
from inferlab.bench.mock_process import MockProcess
from inferlab.bench.plans import WorkerSetup
from inferlab.bench.pool import WorkerPool, auto_workers
from inferlab.bench.profiles import StageSpec
from inferlab.bench.runner import Progress, StageResult, StageRunner
from inferlab.bench.server_metrics import MetricsScraper, ServerTimeline
from inferlab.bench.sweep import SloSearch, run_profile
from inferlab.bench.tags import new_nonce
from inferlab.bench.templates import CHAT_PATH, COMPLETIONS_PATH
from inferlab.bench.timeline import Timeline, build_timeline
from inferlab.bench.workload import Workload, build_workload, resolve_model


@dataclass
class RunResult:
    meta: dict  # target, model, profile, data, workers, start time...
    stages: list[StageResult]
    timeline: Timeline
    server: ServerTimeline
    slo_search: SloSearch | None = None
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False


def run_benchmark(config: BenchConfig, progress: Progress,
                  interrupts: Interrupts | None = None) -> RunResult:
    """interrupts: Ctrl-C's handler (the CLI's), armed here once the workers are up."""
    interrupts = interrupts or Interrupts()
    headers = config.target.request_headers()
    model = resolve_model(config.target.url, config.target.model, headers)
    workload = build_workload(config, model)
    workers = config.measure.workers or auto_workers()
    nonce = new_nonce()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    epoch_ns = now_ns()
    scraper = None
    if config.measure.scrape_interval_s is not None:
        scraper = MetricsScraper(config.target.url, epoch_ns, config.measure.scrape_interval_s,
                                 headers)
        scraper.start()
    pool = WorkerPool(_setups(config.target.url, workload, headers, workers, nonce, config))
    runner = StageRunner(pool, workload.templates, workload.counter, progress,
                         config.slo.bounds() if config.slo else None,
                         config.load.ramp_up_s, epoch_ns=epoch_ns, interrupts=interrupts)
    interrupts.armed = True
    try:
        stages, search = run_profile(runner, config.load, config.limits,
                                     config.slo.bounds() if config.slo else None)
    finally:
        pool.close()
        server = (scraper.stop() if scraper
                  else ServerTimeline(False, "scraping turned off (--scrape-interval 0)"))
    if config.measure.calibration_seconds > 0 and not runner.interrupted and stages:
        calibrate(stages, workload, config, progress, workers, interrupts)
    end_ns = max((s.summary.end_ns for s in stages), default=0)
    meta = {"target": Target.parse(config.target.url).url, "model": model,
            "endpoint": "chat" if config.target.chat else "completions",
            "profile": config.load.profile, "data": workload.description,
            "tokenizer": config.data.tokenizer, "workers": workers, "started_at": started,
            "nonce": nonce, "slo": config.slo.bounds() if config.slo else None,
            "calibration_seconds": config.measure.calibration_seconds,
            "notes": list(workload.notes)}
    result = RunResult(meta, stages, build_timeline([r for s in stages for r in s.records],
                                                    end_ns), server, search,
                       interrupted=interrupts.requested)
    result.warnings = run_warnings(result.stages, workload.counter.exact,
                                   workload.forced_length, workload.verbatim_prompts)
    if scraper is not None and server.note:  # not when --scrape-interval 0 turned it off
        result.warnings.append(server.note)
    return result


def _setups(url: str, workload: Workload, headers: dict[str, str], workers: int, nonce: str,
            config: BenchConfig) -> list[WorkerSetup]:
    path = CHAT_PATH if config.target.chat else COMPLETIONS_PATH
    return [WorkerSetup(w, url, path, tuple(headers.items()), workload.templates, nonce)
            for w in range(workers)]


def floor_spec(result: StageResult, seconds: float) -> StageSpec:
    """The load of a finished stage, for a short replay against a zero-latency mock.

    Rate stages replay their schedule. A closed loop against a zero-latency server
    would spin as fast as the client can go, so it replays as a constant rate equal to
    the rate it achieved, under its stream count as the in-flight cap.
    """
    spec, limits = result.spec, result.spec.limits
    capped = replace(limits, max_seconds=min(limits.max_seconds or seconds, seconds),
                     drain_seconds=min(limits.drain_seconds, 2.0), warmup=Span(),
                     cooldown=Span())
    if spec.rate_based:
        return replace(spec, limits=capped)
    rate = result.summary.sent_rate or result.summary.request_throughput or 1.0
    return StageSpec("constant", rate, spec.streams, capped, spec.seed)


def calibrate(stages: list[StageResult], workload: Workload, config: BenchConfig,
              progress: Progress, workers: int, interrupts: Interrupts) -> None:
    """Replay each stage briefly against a zero-latency mock: the client's own floor."""
    seconds = config.measure.calibration_seconds
    # no context limit: the floor replays the user's workload, whatever its lengths
    with MockProcess(MockConfig(max_model_len=UNLIMITED_MODEL_LEN)) as mock:
        pool = WorkerPool(_setups(mock.url, workload, {}, workers, new_nonce(), config))
        runner = StageRunner(pool, workload.templates, None, progress, None,
                             config.load.ramp_up_s, label_prefix="floor ",
                             epoch_ns=now_ns(), interrupts=interrupts)
        try:
            for result in stages:
                floor = runner.run(floor_spec(result, seconds), result.summary.info.stage)
                result.floor = floor.summary
                if runner.interrupted:
                    break
        finally:
            pool.close()

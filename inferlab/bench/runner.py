"""Runs one stage: hands it to the workers, collects and parses what they send back,
and stops it early when too many requests fail or the user presses Ctrl-C."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from inferlab.bench.client import RawExchange, now_ns
from inferlab.bench.config import NS_PER_S
from inferlab.bench.interrupts import Interrupts
from inferlab.bench.plans import WorkerReport
from inferlab.bench.pool import WorkerPool, split_stage
from inferlab.bench.profiles import StageSpec
from inferlab.bench.records import OUTCOMES, RequestRecord, to_record
from inferlab.bench.summary import StageInfo, StageSummary, summarize
from inferlab.bench.templates import RequestTemplate
from inferlab.bench.tokens import TokenCounter

START_LEAD_S = 0.25  # time for every worker to receive its plan before the stage starts
ERROR_RATE_MIN_FINISHED = 10  # finished requests before --max-error-rate may stop a stage
INTERRUPT_GRACE_S = 15.0  # after Ctrl-C, how long workers get to hand back their records


@dataclass
class Snapshot:
    """Live numbers for the progress display."""

    label: str
    elapsed_s: float
    max_seconds: float | None
    max_requests: int | None
    sent: int
    in_flight: int
    counts: dict[str, int]
    recent: list[RequestRecord]  # the last few finished requests


class Progress(Protocol):
    def stage_started(self) -> None: ...
    def update(self, snapshot: Snapshot) -> None: ...
    def stage_finished(self, summary: StageSummary) -> None: ...


@dataclass
class StageResult:
    spec: StageSpec
    summary: StageSummary
    records: list[RequestRecord]
    floor: StageSummary | None = None  # the same stage against the zero-latency mock


@dataclass
class _Tally:
    """Running counts of a stage, per worker where workers report totals."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    sent: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def add(self, report: WorkerReport, parsed: list[RequestRecord]) -> None:
        for record in parsed:
            self.counts[record.outcome] += 1
        self.sent[report.worker_id] = report.sent
        self.in_flight[report.worker_id] = report.in_flight
        if report.done:
            self.done.add(report.worker_id)

    def snapshot(self, label: str, spec: StageSpec, start_ns: int,
                 records: list[RequestRecord]) -> Snapshot:
        return Snapshot(label, max(0.0, (now_ns() - start_ns) / NS_PER_S), spec.limits.max_seconds,
                        spec.limits.max_requests, sum(self.sent.values()),
                        sum(self.in_flight.values()), dict(self.counts), records[-64:])


@dataclass
class StageRunner:
    pool: WorkerPool
    templates: tuple[RequestTemplate, ...]
    counter: TokenCounter | None
    progress: Progress
    slo: dict[str, float] | None
    ramp_up_s: float = 0.0
    label_prefix: str = ""  # "floor " for calibration stages
    epoch_ns: int | None = None  # the first stage's start; every record's time is from here
    interrupts: Interrupts = field(default_factory=Interrupts)  # Ctrl-C, polled while collecting

    @property
    def interrupted(self) -> bool:
        """Ctrl-C was pressed: the stage in hand stops, and no other starts."""
        return self.interrupts.requested

    def run(self, spec: StageSpec, stage: int) -> StageResult:
        start_ns = now_ns() + round(START_LEAD_S * NS_PER_S)
        if self.epoch_ns is None:
            self.epoch_ns = start_ns
        plans = split_stage(spec, stage, self.pool.size, start_ns, self.ramp_up_s)
        self.pool.send_stage(plans)
        self.progress.stage_started()
        records: list[RequestRecord] = []
        stop_reason = self._collect(spec, stage, start_ns, records)
        # a rate stage stopped early meant to send only what was due by then: the records
        # hold those, sent or counted as never sent
        planned = sum(len(p.offsets_ns or ()) for p in plans)
        if not spec.rate_based:
            scheduled = sum(r.start_ns is not None for r in records)
        else:
            scheduled = len(records) if stop_reason else planned
        stop_reason = stop_reason or self._natural_stop(spec, start_ns, scheduled)
        info = StageInfo(stage, self.label_prefix + spec.label, spec.kind, spec.rate,
                         start_ns - self.epoch_ns, stop_reason, scheduled)
        summary = summarize(info, records, spec.limits.warmup, spec.limits.cooldown, self.slo,
                            spec.limits.requests_bound)
        self.progress.stage_finished(summary)
        return StageResult(spec, summary, records)

    def _collect(self, spec: StageSpec, stage: int, start_ns: int,
                 records: list[RequestRecord]) -> str:
        """Gather reports until every worker is done; returns why the stage stopped early,
        or "" when it ran to one of its bounds."""
        tally = _Tally()
        stop_reason = ""
        give_up_at = None
        while len(tally.done) < self.pool.size:
            reports = self.pool.receive(0.1)
            if self.interrupted and give_up_at is None:
                stop_reason = "interrupted"
                self.pool.stop()
                give_up_at = time.monotonic() + INTERRUPT_GRACE_S
            for report in reports:
                parsed = self._parse(report.exchanges, stage, report.worker_id)
                tally.add(report, parsed)
                records.extend(parsed)
            if not stop_reason and self._too_many_errors(spec, tally.counts):
                stop_reason = "max_error_rate"
                self.pool.stop()
            if give_up_at is not None and time.monotonic() > give_up_at:
                break
            self.progress.update(tally.snapshot(self.label_prefix + spec.label, spec, start_ns,
                                                records))
        return stop_reason

    def _parse(self, exchanges: list[RawExchange], stage: int, worker: int) -> list[RequestRecord]:
        assert self.epoch_ns is not None
        return [to_record(raw, stage, worker, self.epoch_ns, self.templates[raw.template],
                          self.counter) for raw in exchanges]

    @staticmethod
    def _too_many_errors(spec: StageSpec, counts: dict[str, int]) -> bool:
        limit = spec.limits.max_error_rate
        finished = counts["ok"] + counts["error"]
        if limit is None or finished < ERROR_RATE_MIN_FINISHED:
            return False
        return counts["error"] / finished > limit

    @staticmethod
    def _natural_stop(spec: StageSpec, start_ns: int, scheduled: int) -> str:
        """The bound that ended a stage. A rate stage's schedule was cut by the request cap
        or else by --max-seconds, however early its requests finished; a closed loop ran
        until --max-seconds, or else until the request cap."""
        limits = spec.limits
        if spec.rate_based:
            capped = limits.max_requests is not None and scheduled >= limits.max_requests
        else:
            timed = (limits.max_seconds is not None
                     and now_ns() - start_ns >= limits.max_seconds * NS_PER_S)
            capped = not timed and limits.max_requests is not None
        return "max_requests" if capped else "max_seconds"

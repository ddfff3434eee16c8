"""Messages between the coordinator and its worker processes (all picklable)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferlab.bench.client import RawExchange
from inferlab.bench.templates import RequestTemplate


@dataclass(frozen=True)
class WorkerSetup:
    """Sent once when a worker starts."""

    worker_id: int
    target_url: str
    path: str  # /v1/completions or /v1/chat/completions
    headers: tuple[tuple[str, str], ...]  # extra request headers (Authorization...)
    templates: tuple[RequestTemplate, ...]  # request i uses templates[i % len]
    nonce: str  # makes prompts unique across runs, not just requests


@dataclass(frozen=True)
class WorkerStage:
    """One worker's share of a stage.

    Rate mode (`offsets_ns` given): send request `indices[k]` at `start_ns +
    offsets_ns[k]`. Stream mode: run `streams` closed loops, each sending its next
    request when the last one ends, the n-th numbered
    `index_base + n // streams * index_stride + n % streams`.
    """

    stage: int
    start_ns: int  # monotonic ns, the same clock in every process
    stop_issuing_ns: int | None  # no new request after this (max-seconds)
    hard_stop_ns: int | None  # in-flight requests are cancelled at this time (drain end)
    request_timeout_s: float
    offsets_ns: tuple[int, ...] | None = None
    indices: tuple[int, ...] = ()
    max_in_flight: int | None = None  # rate mode: a cap on this worker's in-flight requests
    streams: int = 0
    max_requests: int | None = None  # stream mode: this worker's share of the stage's cap
    index_base: int = 0
    index_stride: int = 1
    queued_at_start: bool = False  # stream mode: every request was due at the start
    ramp_up_ns: int = 0  # stream mode: stream s starts at start + s * ramp_up / streams
    stream_offset: int = 0  # stream mode: this worker's first stream number (for ramp-up)
    total_streams: int = 0  # stream mode: streams across all workers (for ramp-up)


@dataclass
class WorkerReport:
    """What a worker sends back as requests finish, and once at the end of a stage."""

    worker_id: int
    stage: int
    exchanges: list[RawExchange] = field(default_factory=list)  # finished since the last report
    in_flight: int = 0
    sent: int = 0  # requests started in this stage so far
    done: bool = False  # the stage is over for this worker

"""The worker processes of a run, and how a stage is split between them."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from itertools import chain
from multiprocessing.connection import Connection, wait

from inferlab.bench.config import NS_PER_S
from inferlab.bench.plans import WorkerReport, WorkerSetup, WorkerStage
from inferlab.bench.profiles import StageSpec, send_offsets_ns
from inferlab.bench.worker import EXIT, READY, STOP, worker_main

WORKER_START_TIMEOUT_S = 60.0


def auto_workers() -> int:
    """One event loop paces hundreds of requests/s; more help only with spare cores."""
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(4, cores // 2)


class WorkerPool:
    """Worker processes (spawned: no inherited threads or sockets), one pipe each."""

    def __init__(self, setups: list[WorkerSetup]) -> None:
        context = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for setup in setups:
            parent, child = context.Pipe(duplex=True)
            proc = context.Process(target=worker_main, args=(child,), daemon=True,
                                   name=f"bench-worker-{setup.worker_id}")
            proc.start()
            child.close()
            parent.send(setup)
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:  # a stage's schedule must not start before its workers
            if not conn.poll(WORKER_START_TIMEOUT_S) or conn.recv() != READY:
                self.close()
                raise RuntimeError("a benchmark worker process did not start")

    @property
    def size(self) -> int:
        return len(self.conns)

    def send_stage(self, plans: list[WorkerStage]) -> None:
        for conn, plan in zip(self.conns, plans, strict=True):
            conn.send(plan)

    def broadcast(self, message: str) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a dead worker is reported by receive()
                conn.send(message)

    def stop(self) -> None:
        self.broadcast(STOP)

    def receive(self, timeout_s: float) -> list[WorkerReport]:
        """Reports that arrived within `timeout_s`; raises if a worker died."""
        reports = []
        for conn in wait(self.conns, timeout=timeout_s):
            try:
                reports.append(conn.recv())  # type: ignore[union-attr]
            except EOFError:
                raise RuntimeError("a benchmark worker process died; see its error above") \
                    from None
        return reports

    def close(self) -> None:
        self.broadcast(EXIT)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2)
        for conn in self.conns:
            conn.close()


def split_stage(spec: StageSpec, stage: int, workers: int, start_ns: int,
                ramp_up_s: float) -> list[WorkerStage]:
    """Each worker's share: rate stages deal scheduled sends in proportion to each worker's
    part of the in-flight cap, closed-loop stages deal streams in contiguous blocks and the
    requests by stream slot (`_slot_share`)."""
    limits = spec.limits
    stop_ns = None if limits.max_ns is None else start_ns + limits.max_ns
    hard_ns = None if stop_ns is None else stop_ns + round(limits.drain_seconds * NS_PER_S)
    common = {"stage": stage, "start_ns": start_ns, "stop_issuing_ns": stop_ns,
              "hard_stop_ns": hard_ns, "request_timeout_s": limits.request_timeout_s}
    if spec.rate_based:
        return _rate_plans(spec, workers, common)
    streams = spec.streams
    plans = []
    for w in range(workers):
        lo, hi = streams * w // workers, streams * (w + 1) // workers
        share = None if limits.max_requests is None else \
            _slot_share(limits.max_requests, lo, hi, streams)
        plans.append(WorkerStage(
            **common, streams=hi - lo, max_requests=share, index_base=lo, index_stride=streams,
            queued_at_start=spec.kind == "throughput" and limits.max_requests is not None,
            ramp_up_ns=round(ramp_up_s * NS_PER_S), stream_offset=lo, total_streams=streams))
    return plans


def _slot_share(max_requests: int, lo: int, hi: int, streams: int) -> int:
    """How many of requests 0..max_requests-1 fall to streams lo..hi-1 when request k is
    stream k % streams's, as one client's streams take turns at equal latency. These
    indices partition 0..max_requests-1 over the workers, so N requests send each of N
    prompts once; a worker numbers its n-th request as `WorkerStage` says."""
    return sum(len(range(s, max_requests, streams)) for s in range(lo, hi))


def _rate_plans(spec: StageSpec, workers: int, common: dict) -> list[WorkerStage]:
    """Send k takes slot k % cap of --max-concurrency, and slot j belongs to worker
    j % workers. Each worker's share of the sends is then its share of the cap, and a send
    reuses the slot of the send `cap` before it, as with one shared cap at a steady rate;
    sends dealt evenly over unequal parts overload the worker with the smaller part.
    Uncapped, each worker is one slot."""
    offsets = send_offsets_ns(spec)
    cap = spec.max_concurrency
    slots = workers if cap is None else cap
    plans = []
    for w in range(workers):
        own_slots = range(w, slots, workers)  # none when the cap is below the worker count
        # each slot's sends are an ascending run: sorting merges the runs
        mine = sorted(chain.from_iterable(range(j, len(offsets), slots) for j in own_slots))
        plans.append(WorkerStage(**common, offsets_ns=tuple(offsets[k] for k in mine),
                                 indices=tuple(mine),
                                 max_in_flight=None if cap is None else len(own_slots)))
    return plans

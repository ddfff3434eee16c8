"""A scheduled send due before --max-seconds is sent even when its timer wakes a little
after the stage's end: under --max-concurrency only a send the cap held back past the end
is dropped as never sent."""

from __future__ import annotations

import asyncio

import pytest

from inferlab.bench import worker as worker_module
from inferlab.bench.client import ConnectionPool, Target, now_ns
from inferlab.bench.plans import WorkerSetup, WorkerStage
from inferlab.bench.templates import RequestTemplate

MS = 1_000_000
TEMPLATE = RequestTemplate(b'{"model": "mock-model", "prompt": "hello ', b'", "max_tokens": 2, '
                           b'"stream": true, "stream_options": {"include_usage": true}}', 2, 2)
LEAD_NS = 50 * MS  # the schedule starts this long after the plan is made
STOP_NS = 100 * MS  # --max-seconds of the plans below


def run_schedule(url: str, offsets_ns: tuple[int, ...], cap: int) -> list:
    """The exchanges of one worker's rate stage under an in-flight cap of `cap`."""
    async def stage() -> list:
        setup = WorkerSetup(0, url, "/v1/completions", (), (TEMPLATE,), "nonce")
        worker = worker_module._Worker(None, setup)  # type: ignore[arg-type]
        worker.pool = ConnectionPool(Target.parse(url))
        start_ns = now_ns() + LEAD_NS
        plan = WorkerStage(stage=0, start_ns=start_ns, stop_issuing_ns=start_ns + STOP_NS,
                           hard_stop_ns=None, request_timeout_s=5.0, offsets_ns=offsets_ns,
                           indices=tuple(range(len(offsets_ns))), max_in_flight=cap)
        await worker._issue_on_schedule(plan)
        while worker.tasks:
            await asyncio.gather(*list(worker.tasks))
        worker.pool.close()
        return worker.finished

    return asyncio.run(stage())


@pytest.mark.parametrize("due_before_stop_ns", [1, 100_000, 1 * MS])
def test_a_send_due_just_before_the_end_is_sent_when_its_timer_wakes_after_it(
        mock_server, monkeypatch, due_before_stop_ns):
    # the last send is due before the end; its timer wakes 3 ms late, after the end, with
    # 7 of 8 slots free: nothing held it back, so it is sent
    async def late_sleep_until(t_ns: int) -> None:
        await asyncio.sleep(max(0.0, (t_ns + 3 * MS - now_ns()) / 1e9))

    monkeypatch.setattr(worker_module, "_sleep_until", late_sleep_until)
    url = mock_server(itl_ms=1)
    offsets = (0, 50 * MS, STOP_NS - due_before_stop_ns)
    exchanges = run_schedule(url, offsets, cap=8)
    assert sorted(e.index for e in exchanges) == [0, 1, 2]
    assert all(e.start_ns and not e.cancelled for e in exchanges)
    # sent when it woke: the dispatch lag is the timer's, not a dropped request
    last = next(e for e in exchanges if e.index == 2)
    assert last.start_ns - last.intended_ns >= 3 * MS


def test_a_send_the_cap_held_back_past_the_end_is_never_sent(mock_server):
    # one slot, the first request lasts ~300 ms: the second, due at 50 ms, waits for the
    # slot until long after the end (100 ms) and is dropped, not sent late
    url = mock_server(ttft_ms=300, itl_ms=1)
    exchanges = run_schedule(url, (0, 50 * MS), cap=1)
    by_index = {e.index: e for e in exchanges}
    assert by_index[0].start_ns and not by_index[0].cancelled
    assert by_index[1].cancelled and by_index[1].start_ns == 0  # never sent


def test_a_send_the_cap_held_back_but_freed_before_the_end_is_sent(mock_server):
    # one slot, the first request lasts ~20 ms: the second, due at 5 ms, gets the slot
    # well before the end and is sent
    url = mock_server(ttft_ms=20, itl_ms=1)
    exchanges = run_schedule(url, (0, 5 * MS), cap=1)
    assert sorted(e.index for e in exchanges) == [0, 1]
    assert all(e.start_ns and not e.cancelled for e in exchanges)

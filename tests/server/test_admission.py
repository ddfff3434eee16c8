"""Admission's count of waiting sequences, case by case against an engine whose last step is
given by hand: a sequence waits only when the engine could not run it now."""

from __future__ import annotations

from types import SimpleNamespace

from inferlab.server.admission import Admission


def admission(max_num_seqs: int, max_queued: int, engine_running: int = 0,
              engine_waiting: int = 0) -> Admission:
    """An Admission over an engine of max_num_seqs slots whose last step left engine_running
    sequences running and engine_waiting waiting (set `.engine.running`, `.engine.waiting`)."""
    engine = SimpleNamespace(max_num_seqs=max_num_seqs, running=engine_running,
                             waiting=engine_waiting)
    engine.stats = lambda: SimpleNamespace(scheduler=SimpleNamespace(num_running=engine.running,
                                                                num_waiting=engine.waiting))
    return Admission(engine, max_queued)  # type: ignore[arg-type]


def admitted(gate: Admission, requests: int, num_seqs: int = 1) -> list[bool]:
    return [gate.try_admit(num_seqs) for _ in range(requests)]


def test_a_burst_between_two_steps_fills_the_free_slots_then_the_queue():
    """4 slots, a queue of 4, an idle engine whose last step saw nothing: 8 requests at once
    are 4 to run and 4 to wait; the 9th finds 4 waiting and is refused. The running count of
    the last step (0) once made all 8 count as waiting: 4 admitted."""
    gate = admission(max_num_seqs=4, max_queued=4)
    assert admitted(gate, 8) == [True] * 8
    assert gate.num_waiting == 4
    assert admitted(gate, 1) == [False]
    gate.release(1)  # one finished: 7 admitted, 3 beyond the slots
    assert gate.num_waiting == 3 and admitted(gate, 1) == [True]


def test_a_beam_search_between_rounds_holds_slots_not_queue_places():
    """2 slots, a queue of 2; a beam search of width 2 (2 sequences) between two rounds, so
    the engine's last step saw none of them: plain requests take the 2 queue places, and only
    a third is refused. All of them were refused while the search ran."""
    gate = admission(max_num_seqs=2, max_queued=2)
    assert gate.try_admit(2)
    assert gate.num_waiting == 0
    assert admitted(gate, 3) == [True, True, False]


def test_sequences_the_engine_could_not_schedule_wait_even_with_free_slots():
    """256 slots, a queue of 4: the KV cache (or a long prompt's step) held 3 of 5 admitted
    sequences back at the last step: 3 wait, one more may queue; at 4 waiting, no more."""
    gate = admission(max_num_seqs=256, max_queued=4)
    assert admitted(gate, 5) == [True] * 5
    gate.engine.running, gate.engine.waiting = 2, 3
    assert gate.num_waiting == 3 and admitted(gate, 1) == [True]
    gate.engine.waiting = 4
    assert gate.num_waiting == 4 and admitted(gate, 1) == [False]


def test_the_engines_waiting_count_is_capped_at_what_this_server_admitted():
    """Another server on the same engine has 10 sequences waiting; this one admitted 2: at
    most its own 2 wait."""
    gate = admission(max_num_seqs=1, max_queued=3, engine_running=1, engine_waiting=10)
    assert admitted(gate, 2) == [True, True]
    assert gate.num_waiting == 2
    assert gate.try_admit(1)  # 2 waiting < 3
    assert gate.num_waiting == 3


def test_one_request_of_n_sequences_may_take_the_last_places():
    """1 slot, a queue of 2: one sequence runs, then n = 3 finds 0 waiting and is admitted
    whole (3 wait); the next finds the queue past full."""
    gate = admission(max_num_seqs=1, max_queued=2)
    assert gate.try_admit(1) and gate.try_admit(3)
    assert gate.num_waiting == 3
    assert not gate.try_admit(1)

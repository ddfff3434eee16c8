"""Ctrl-C's handler for a load-test run (inferlab/bench/interrupts.py), against POSIX's
conventions: a signal ignored when the program started stays ignored."""

from __future__ import annotations

import os
import signal

import pytest

from inferlab.bench.interrupts import Interrupts


@pytest.fixture
def default_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_press_before_the_load_ends_the_program_and_after_it_asks_the_stage_to_stop(default_sigint):
    with Interrupts().installed() as interrupts:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        interrupts.armed = True
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.requested and interrupts.presses == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigint_ignored_at_start_stays_ignored():
    """A background job (`cmd &` in a script) starts with SIGINT ignored: the run once stopped on
    it, or died in its set-up without writing anything."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Interrupts().installed() as interrupts:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not interrupts.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)

"""Timing a call on this machine, for the choices made by measuring (a kernel's path, the
planner's figures) and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` timed calls after one warm-up call."""
    fn()  # warm up: page faults, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best

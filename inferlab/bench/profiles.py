"""Load profiles as stages, and the send schedule of each stage.

A stage is one steady load: one request at a time (synchronous), N streams
(concurrent), everything at once under a concurrency cap (throughput), or a rate of
new requests (constant, poisson). A sweep and an SLO search are sequences of stages
whose rates depend on what earlier stages measured; the pure logic for that is here,
the running is in `runner.py`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from inferlab.bench.config import NS_PER_S, LoadConfig, StageLimits

STAGE_KINDS = ("synchronous", "concurrent", "throughput", "constant", "poisson")
RATE_KINDS = ("constant", "poisson")  # open loops: requests sent on a schedule, not on replies
DEFAULT_THROUGHPUT_CONCURRENCY = 256


@dataclass(frozen=True)
class StageSpec:
    """One stage to run."""

    kind: str  # one of STAGE_KINDS
    rate: float | None  # req/s (constant, poisson); streams (concurrent); None otherwise
    max_concurrency: int | None  # in-flight cap; for throughput, the number of streams
    limits: StageLimits
    seed: int = 0  # for poisson gaps

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}")
        if (self.kind in ("concurrent", "constant", "poisson")) != (self.rate is not None):
            raise ValueError(f"stage {self.kind} rate {self.rate}: rate given iff it has one")

    @property
    def label(self) -> str:
        if self.kind == "concurrent":
            return f"concurrent@{int(self.rate or 0)}"
        if self.kind in ("constant", "poisson"):
            # six significant digits: rates a user tells apart (1000.1, 1000.4) stay apart,
            # and %g drops what is not there (20/s, not 20.0000/s)
            return f"{self.kind}@{self.rate:.6g}/s"
        if self.kind == "throughput":
            return f"throughput@{self.streams}"
        return self.kind

    @property
    def rate_based(self) -> bool:
        return self.kind in RATE_KINDS

    @property
    def streams(self) -> int:
        """Closed-loop stream count (synchronous, concurrent, throughput)."""
        if self.kind == "synchronous":
            return 1
        if self.kind == "concurrent":
            return int(self.rate or 1)
        if self.kind == "throughput":
            return self.max_concurrency or DEFAULT_THROUGHPUT_CONCURRENCY
        raise ValueError(f"a {self.kind} stage has no streams")


def fixed_stages(load: LoadConfig, limits: StageLimits) -> list[StageSpec]:
    """The stages of a profile whose rates are known up front (not sweep)."""
    if load.profile in ("synchronous", "throughput"):
        return [StageSpec(load.profile, None, load.max_concurrency, limits, load.seed)]
    return [StageSpec(load.profile, rate, load.max_concurrency, limits, load.seed + i)
            for i, rate in enumerate(load.rates)]


def send_offsets_ns(stage: StageSpec) -> list[int]:
    """Intended send times of a rate-based stage, in ns from its start: every send strictly
    before --max-seconds (rate x seconds of them at a constant rate), up to --max-requests.

    The schedule is fixed before the stage runs: a late send never shifts the next
    one, so the achieved rate is the asked rate unless the client truly falls behind.
    """
    horizon_ns = stage.limits.max_ns
    cap = stage.limits.max_requests if stage.limits.max_requests is not None else math.inf
    offsets: list[int] = []
    for offset_ns in _send_times_ns(stage):
        if len(offsets) >= cap or (horizon_ns is not None and offset_ns >= horizon_ns):
            break
        offsets.append(offset_ns)
    return offsets


def _send_times_ns(stage: StageSpec) -> Iterator[int]:
    """The endless schedule. A constant rate's k-th send is k / rate from the start,
    computed afresh: summed gaps gather float error, which once put a send at exactly
    --max-seconds (7/s for 1 s sent 8)."""
    rate = stage.rate or 0.0
    if stage.kind == "poisson":
        return _poisson_times_ns(rate, stage.seed)
    return (round(k * NS_PER_S / rate) for k in itertools.count())


def _poisson_times_ns(rate: float, seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    t_ns = 0.0
    while True:
        yield round(t_ns)
        t_ns += rng.expovariate(rate) * NS_PER_S


def sweep_rates(sync_rate: float, throughput_rate: float, sweep_size: int) -> list[float]:
    """The constant rates of a sweep of `sweep_size` stages in all, as guidellm's: after the
    synchronous and throughput stages, sweep_size - 2 rates evenly spaced from the
    synchronous rate (excluded) to the throughput rate (included)."""
    steps = sweep_size - 2
    # weighted, not sync + k * step: at k = steps the weights are 0 and 1, so the last rate
    # is the throughput rate to the bit
    return [sync_rate * (1 - k / steps) + throughput_rate * (k / steps)
            for k in range(1, steps + 1)]


def bisect_next(passing: float, failing: float) -> float:
    """The next rate an SLO search tries: midway between the best pass and worst fail."""
    return (passing + failing) / 2


def search_bounds(results: list[tuple[float, bool]]) -> tuple[float, float | None]:
    """Highest passing rate below the lowest failing one, and that failing rate."""
    failing = min((rate for rate, ok in results if not ok), default=None)
    passing = max((rate for rate, ok in results
                   if ok and (failing is None or rate < failing)), default=0.0)
    return passing, failing

"""Where --max-concurrency held a rate stage's sends back, the warnings name it, not the
client, and say what the never-sent requests are."""

from __future__ import annotations

from test_drain_warning import CannedRunner, record

from inferlab.bench.caveats import stage_warnings
from inferlab.bench.config import LoadConfig, Span, StageLimits
from inferlab.bench.profiles import StageSpec
from inferlab.bench.records import RequestRecord
from inferlab.bench.runner import StageResult
from inferlab.bench.summary import StageInfo, summarize
from inferlab.bench.sweep import run_profile

MS = 1_000_000  # ns
LIMITS = StageLimits(max_seconds=2.0, drain_seconds=1.5)


def one_at_a_time(n: int = 10) -> list[RequestRecord]:
    """Due every 50 ms (20 req/s), but each takes 200 ms and one slot sends it only when
    the one before ended: sent every 200 ms, 5 req/s."""
    out = []
    for i in range(n):
        start = i * 200 * MS
        out.append(RequestRecord(0, i, "ok", "", 200, i * 50 * MS, start, start + 100 * MS,
                                 start + 200 * MS, [start + 100 * MS], [1], 1, "usage", 10))
    return out


def rate_warning(cap: int | None) -> str:
    spec = StageSpec("constant", 20.0, cap, LIMITS)
    info = StageInfo(0, spec.label, "constant", 20.0, 0, "max_seconds", 10)
    records = one_at_a_time()
    result = StageResult(spec, summarize(info, records, Span(), Span(), None), records)
    (warning,) = [w for w in stage_warnings(result, False, True) if w.startswith("scheduled")]
    return warning


def test_a_cap_that_held_the_sends_back_is_named_as_the_cause():
    warning = rate_warning(cap=1)
    assert warning.startswith("scheduled 20 req/s but sent 5 (-75.0%)")
    assert "--max-concurrency 1 held the sends back" in warning
    assert "the client could not keep the schedule" not in warning


def test_without_a_cap_the_client_fell_behind():
    assert rate_warning(cap=None).endswith("the client could not keep the schedule")


def test_sends_the_cap_held_past_the_end_are_explained():
    # every sent request answered: before, the never-sent ones went unexplained
    records = [record(0, "ok"), record(1, "cancelled", sent=False),
               record(2, "cancelled", sent=False)]
    (result,), _ = run_profile(CannedRunner(records), LoadConfig("constant", (10.0,), 1),
                               LIMITS, None)
    assert result.summary.warnings == [
        "2 scheduled sends were never made (--max-concurrency 1 held them back until "
        "--max-seconds ended); they count as cancelled, and the server never saw them"]


def test_never_sent_beside_unanswered_names_the_cap():
    records = [record(0, "cancelled"), record(1, "cancelled", sent=False)]
    (result,), _ = run_profile(CannedRunner(records), LoadConfig("constant", (10.0,), 1),
                               LIMITS, None)
    (warning,) = [w for w in result.summary.warnings if "unanswered" in w]
    assert warning.endswith("(the other 1 cancelled were scheduled sends never made: "
                            "--max-concurrency 1 held them back until --max-seconds ended)")

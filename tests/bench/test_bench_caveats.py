"""Run-wide warnings on hand-built stages: what a reader must know before trusting a table."""

from __future__ import annotations

from inferlab.bench.caveats import stage_warnings
from inferlab.bench.config import Span, StageLimits
from inferlab.bench.profiles import StageSpec
from inferlab.bench.records import RequestRecord
from inferlab.bench.runner import StageResult
from inferlab.bench.summary import StageInfo, summarize

MS = 1_000_000  # ns
SPEC = StageSpec("synchronous", None, None, StageLimits(max_requests=3))
INFO = StageInfo(0, "synchronous", "synchronous", None, 0, "max_requests", 3)


def ok(index: int, output_tokens: int, asked: int) -> RequestRecord:
    """A request of 100 ms that returned `output_tokens` of the `asked` max_tokens."""
    start = index * 100 * MS
    return RequestRecord(0, index, "ok", "", 200, start, start, start + 50 * MS,
                         start + 100 * MS, [start + 50 * MS], [output_tokens], output_tokens,
                         "usage", 10, 10, asked)


def failed(index: int, error: str) -> RequestRecord:
    start = index * 100 * MS
    return RequestRecord(0, index, "error", error, 404, start, start, None, start + 5 * MS)


def stage(records: list[RequestRecord]) -> StageResult:
    return StageResult(SPEC, summarize(INFO, records, Span(), Span(), None), records)


def test_failed_requests_are_counted_with_the_first_reason():
    records = [ok(0, 8, 8), failed(1, "HTTP 404: model nosuch not found"),
               failed(2, "HTTP 500: overloaded")]
    warnings = stage_warnings(stage(records), tokenizer=False, forced_length=True)
    assert warnings == ["2 of 3 requests failed; the first: HTTP 404: model nosuch not found"]


def test_short_outputs_are_a_warning_only_when_the_length_was_forced():
    # max_tokens 8 asked of each; the server stopped one at EOS after 3 tokens
    records = [ok(0, 8, 8), ok(1, 3, 8)]
    assert stage_warnings(stage(records), tokenizer=False, forced_length=False) == []
    assert stage_warnings(stage(records), tokenizer=False, forced_length=True) == [
        "1 of 2 successful requests did not return the asked number of output tokens "
        "(does the server honour ignore_eos?)"]


def test_late_sends_are_counted_in_the_lag_warning():
    # 10 req/s: sends due at 0, 100 and 200 ms; the third left 20 ms late, so p99 lag is
    # 19.6 ms (numpy's linear percentile of 0, 0, 20) and exactly one request was late
    spec = StageSpec("constant", 10.0, None, StageLimits(max_requests=3))
    info = StageInfo(0, "constant@10", "constant", 10.0, 0, "max_requests", 3)
    on_time = [ok(0, 8, 8), ok(1, 8, 8)]
    late = ok(2, 8, 8)
    late.start_ns += 20 * MS
    records = [*on_time, late]
    result = StageResult(spec, summarize(info, records, Span(), Span(), None), records)
    warnings = stage_warnings(result, tokenizer=False, forced_length=True)
    assert ("1 request was sent more than 5 ms late (p99 lag 19.6 ms); latency from the "
            "intended time shows the cost") in warnings

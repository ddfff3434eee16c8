"""--slo tpot_ms bounds the time per output token after the first, as vLLM's
`--goodput tpot:X` ((e2e - ttft) / (output tokens - 1), "excl. 1st token") and guidellm's
GoodputSLO.tpot_ms (its inter-token latency) read it."""

from __future__ import annotations

from inferlab.bench.config import Span
from inferlab.bench.metrics import meets_slo
from inferlab.bench.records import RequestRecord
from inferlab.bench.summary import StageInfo, slo_percentile_check, summarize

MS = 1_000_000  # ns
# the mock at --ttft-ms 100 --itl-ms 20: 10 tokens, the first at 100 ms, the last at 280 ms;
# vLLM's TPOT is (280 - 100) / 9 = 20 ms (first token included it would be 28 ms)
TOKENS = [100 * MS + k * 20 * MS for k in range(10)]
R = RequestRecord(stage=0, index=0, outcome="ok", error="", status=200, intended_ns=0,
                  start_ns=0, first_token_ns=TOKENS[0], end_ns=TOKENS[-1],
                  chunk_ns=TOKENS, chunk_tokens=[1] * 10, output_tokens=10,
                  output_tokens_source="usage", prompt_tokens=20)


def test_tpot_bound_is_on_the_time_per_token_after_the_first():
    assert meets_slo(R, {"tpot_ms": 25.0})  # 20 ms <= 25
    assert meets_slo(R, {"tpot_ms": 20.0})
    assert not meets_slo(R, {"tpot_ms": 19.0})


def test_goodput_and_the_slo_search_count_it():
    info = StageInfo(0, "constant@5/s", "constant", 5.0, 0, "max_requests", 1)
    s = summarize(info, [R], Span(), Span(), {"tpot_ms": 25.0})
    assert s.slo_fraction == 1.0 and s.goodput == 1 / 0.28
    passed, observed = slo_percentile_check([R], {"tpot_ms": 25.0})
    assert passed and observed["tpot_ms"] == 20.0

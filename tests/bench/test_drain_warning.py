"""Requests the server never finished are cut when the drain after --max-seconds ends and
count as cancelled (guidellm's "incomplete"), not as errors: the run says so in a warning,
apart from scheduled sends the client never made."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from bench_helpers import bench_config, run

from inferlab.bench.config import LoadConfig, Span, StageLimits
from inferlab.bench.profiles import StageSpec
from inferlab.bench.records import RequestRecord
from inferlab.bench.runner import StageResult
from inferlab.bench.summary import StageInfo, summarize
from inferlab.bench.sweep import run_profile
from inferlab.cli import main

MS = 1_000_000


def record(i: int, outcome: str, sent: bool = True) -> RequestRecord:
    start = i * 100 * MS
    done = outcome != "cancelled"
    return RequestRecord(
        stage=0, index=i, outcome=outcome, error="" if outcome == "ok" else "x", status=200,
        intended_ns=start, start_ns=start if sent else None,
        first_token_ns=start + MS if done else None, end_ns=start + 2 * MS if sent else None,
        chunk_ns=[start + MS] if done else [], chunk_tokens=[1] if done else [],
        output_tokens=1 if done else 0, output_tokens_source="usage")


@dataclass
class CannedRunner:
    """Answers every stage with the same records and stop reason."""

    records: list[RequestRecord]
    stop_reason: str = "max_seconds"
    interrupted: bool = False

    def run(self, spec: StageSpec, stage: int) -> StageResult:
        info = StageInfo(stage, spec.label, spec.kind, spec.rate, 0, self.stop_reason,
                         len(self.records))
        return StageResult(spec, summarize(info, self.records, Span(), Span(), None),
                           list(self.records))


def drain_warnings(records: list[RequestRecord], stop_reason: str = "max_seconds") -> list[str]:
    limits = StageLimits(max_seconds=2.0, drain_seconds=1.5)
    (result,), _ = run_profile(CannedRunner(records, stop_reason),
                               LoadConfig("constant", (10.0,)), limits, None)
    return [w for w in result.summary.warnings if "unanswered" in w]


def test_requests_cut_at_the_drain_are_counted_in_a_warning():
    records = [record(0, "ok"), record(1, "cancelled"), record(2, "ok"), record(3, "cancelled"),
               record(4, "cancelled"), record(5, "error")]
    (warning,) = drain_warnings(records)
    assert warning.startswith("3 requests were still unanswered when the drain ended, 1.5 s")
    assert "the server stopped answering them" in warning
    assert "cancelled, not as errors" in warning and "never made" not in warning


def test_sends_never_made_are_told_apart_from_unanswered_requests():
    records = [record(0, "cancelled"), record(1, "cancelled", sent=False),
               record(2, "cancelled", sent=False)]
    (warning,) = drain_warnings(records)
    assert warning.startswith("1 request was still unanswered")
    assert "the other 2 cancelled were scheduled sends never made" in warning


@pytest.mark.parametrize("records, stop_reason", [
    # every request answered
    ([record(0, "ok"), record(1, "error")], "max_seconds"),
    # only sends the client never made: the server was asked nothing it left unanswered
    ([record(0, "ok"), record(1, "cancelled", sent=False)], "max_seconds"),
    # an early stop cancels what is in flight: the server did not stop answering
    ([record(0, "ok"), record(1, "cancelled")], "interrupted"),
    ([record(0, "error"), record(1, "cancelled")], "max_error_rate"),
])
def test_no_warning_where_the_drain_cut_nothing(records, stop_reason):
    assert drain_warnings(records, stop_reason) == []


def test_a_hanging_server_is_reported_in_the_run_warnings(mock_server, corpus):
    # every request hangs halfway: all 10 sends of 1 s at 10/s are cut at the drain
    url = mock_server(hang_rate=1.0, itl_ms=1)
    config = bench_config(url, corpus, "constant", (10.0,), max_seconds=1.0,
                          drain_seconds=0.3, data="prompt_tokens=16,output_tokens=4")
    result = run(config)
    assert result.stages[0].summary.counts == {"ok": 0, "error": 0, "cancelled": 10}
    assert any(w.startswith("constant@10/s: 10 requests were still unanswered when the drain "
                            "ended, 0.3 s") for w in result.warnings)


def test_the_warning_is_printed_and_in_the_json(mock_server, corpus, tmp_path, capsys):
    # one slot: the first request hangs in it, so the other 9 sends are never made
    url = mock_server(hang_rate=1.0, itl_ms=1)
    out = tmp_path / "run.json"
    argv = ["bench", "--target", url, "--profile", "constant", "--rate", "10",
            "--max-seconds", "1", "--drain-seconds", "0.3", "--max-concurrency", "1",
            "--data", "prompt_tokens=8,output_tokens=4", "--data-file", str(corpus),
            "--calibration-seconds", "0", "--scrape-interval", "0", "--workers", "1", "--quiet",
            "--output", str(out)]
    assert main(argv) == 0
    expected = ("constant@10/s: 1 request was still unanswered when the drain ended, 0.3 s "
                "(--drain-seconds) after --max-seconds: the server stopped answering them")
    assert f"warning: {expected}" in capsys.readouterr().out
    warnings = json.loads(out.read_text())["warnings"]
    assert any(w.startswith(expected) and "the other 9 cancelled were scheduled sends never "
               "made" in w for w in warnings)

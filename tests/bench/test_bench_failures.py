"""A server that errors, hangs or drops connections gives counted errors and a finished
report, never a crashed or hung benchmark."""

from __future__ import annotations

import json
import time

from bench_helpers import bench_config, run

from inferlab.bench.outputs import write_outputs


def test_errors_hangs_and_closes_are_counted(mock_server, corpus, tmp_path):
    url = mock_server(itl_ms=2, error_rate=0.2, hang_rate=0.1, close_rate=0.1, seed=3)
    config = bench_config(url, corpus, "concurrent", (4,), max_requests=40,
                          max_seconds=None, request_timeout_s=1.0,
                          data="prompt_tokens=16,output_tokens=8")
    started = time.monotonic()
    result = run(config)
    assert time.monotonic() - started < 30
    (stage,) = result.stages
    errors = [r.error for r in stage.records if r.outcome == "error"]
    assert len(stage.records) == 40 and stage.summary.counts["cancelled"] == 0
    assert stage.summary.counts["ok"] + len(errors) == 40
    kinds = {e.split(":")[0].split(" after")[0] for e in errors}
    # HTTP 500 bodies, hung streams cut by the request timeout, connections dropped
    assert {"HTTP 500", "timeout", "ConnectionError"} <= kinds, kinds
    assert stage.summary.metrics["e2e_ms"]["error"].count == len(errors)
    paths = [str(tmp_path / "r.json"), str(tmp_path / "r.csv"), str(tmp_path / "r.html")]
    write_outputs(result, tuple(paths))
    saved = json.loads((tmp_path / "r.json").read_text())
    assert sum(r["outcome"] == "error" for r in saved["stages"][0]["requests"]) == len(errors)


def test_max_error_rate_stops_the_stage_early(mock_server, corpus):
    url = mock_server(error_rate=1.0)
    config = bench_config(url, corpus, "concurrent", (2,), max_seconds=20.0,
                          max_error_rate=0.5)
    started = time.monotonic()
    result = run(config)
    (stage,) = result.stages
    assert time.monotonic() - started < 10
    assert stage.summary.info.stop_reason == "max_error_rate"
    assert stage.summary.counts["ok"] == 0 and stage.summary.counts["error"] >= 10
    # the table only counts failures; the warnings the console prints say why
    failed = sum(r.outcome == "error" for r in stage.records)
    assert (f"concurrent@2: {failed} of {len(stage.records)} requests failed; the first: "
            "HTTP 500: injected error") in result.warnings, result.warnings


def test_a_rate_stage_stopped_by_errors_ends_where_it_stopped(mock_server, corpus):
    # 20 req/s for 20 s, every request failing: the error limit stops it within a second or
    # two. The ~390 sends not yet due were never meant to go: neither scheduled nor counted,
    # and the window (what throughputs divide by) ends at the stop, not 20 s in.
    url = mock_server(error_rate=1.0)
    config = bench_config(url, corpus, "constant", (20.0,), max_seconds=20.0,
                          max_error_rate=0.5)
    (stage,) = run(config).stages
    summary = stage.summary
    assert summary.info.stop_reason == "max_error_rate"
    assert summary.info.scheduled == len(stage.records) < 100
    assert (summary.window_end_ns - summary.window_start_ns) / 1e9 < 5
    never_sent = [r for r in stage.records if r.start_ns is None]
    last_sent_ns = max(r.start_ns for r in stage.records if r.start_ns is not None)
    assert all(r.intended_ns <= last_sent_ns + 1e9 for r in never_sent)


def test_time_limit_cancels_requests_after_the_drain(mock_server, corpus):
    url = mock_server(hang_rate=1.0, itl_ms=1)
    config = bench_config(url, corpus, "constant", (20.0,), max_seconds=0.5,
                          drain_seconds=0.5, request_timeout_s=30.0)
    started = time.monotonic()
    (stage,) = run(config).stages
    assert time.monotonic() - started < 10
    assert stage.summary.counts["cancelled"] == 10 and stage.summary.counts["ok"] == 0
    assert all(r.start_ns is not None and r.error == "cancelled by the benchmark"
               for r in stage.records)

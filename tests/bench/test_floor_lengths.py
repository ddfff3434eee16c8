"""The client's floor replays the user's own workload against a zero-latency mock with no
context limit: a workload past the mock's default --max-model-len (131072) keeps its floor, and a
floor that measured nothing says so."""

from __future__ import annotations

import dataclasses

from bench_helpers import bench_config, run

from inferlab.bench.caveats import stage_warnings


def test_a_long_workload_keeps_its_floor(mock_server, corpus):
    url = mock_server(max_model_len=200_000)  # the server under test takes it
    # the floor's one request streams 131,100 tokens within calibration_seconds + 2 s of drain:
    # 0.5 s left it unfinished on a loaded machine (the floor replays max_requests, so a quiet
    # one is not slower for the slack)
    config = bench_config(url, corpus, "synchronous", data="prompt_tokens=8,output_tokens=131100",
                          calibration_seconds=10, max_requests=1, max_seconds=None)
    (stage,) = run(config).stages
    assert stage.summary.counts["ok"] == 1
    assert stage.floor.counts["ok"] >= 1 and stage.floor.counts["error"] == 0


def test_a_floor_that_measured_nothing_is_named(mock_server, corpus):
    config = bench_config(mock_server(), corpus, "synchronous", calibration_seconds=0.3,
                          max_requests=2, max_seconds=None)
    (stage,) = run(config).stages
    assert not any("floor" in w for w in stage_warnings(stage, False, False))
    failed = dataclasses.replace(stage.floor, counts={"ok": 0, "error": 3, "cancelled": 0})
    assert "the client floor measured nothing: none of its 3 requests to the zero-latency mock " \
           "succeeded" in stage_warnings(dataclasses.replace(stage, floor=failed), False, False)

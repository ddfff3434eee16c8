"""Reading a JSON report back: a damaged or hand-edited one is a one-line error (exit 2,
not compare's 1, "regression found"), never a traceback."""

from __future__ import annotations

import copy
import json

import pytest
from bench_helpers import synthetic_stage

from inferlab.bench.report_json import FORMAT, load_run
from inferlab.cli import main


def report() -> dict:
    s = synthetic_stage([20.0, 21.0, 22.0], errors=1)
    return {"format": FORMAT, "meta": {"model": "m"}, "stages": [
        {"spec": {}, "summary": s.summary.to_dict(), "floor": s.summary.to_dict(),
         "requests": [r.to_dict() for r in s.records]}]}


def _set(path: str, value: object):
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[int(key)] if key.isdigit() else data[key]  # type: ignore[index]
        if value is DELETE:
            del data[last]
        else:
            data[last] = value
    return edit


DELETE = object()
SUMMARY = "stages.0.summary"
REQUEST = "stages.0.requests.0"


@pytest.mark.parametrize("edit, detail", [
    (_set(f"{SUMMARY}.metrics.ttft_ms", DELETE), "no 'summary.metrics.ttft_ms' field"),
    (_set(f"{SUMMARY}.metrics.ttft_ms.ok", DELETE), "no 'summary.metrics.ttft_ms.ok' field"),
    (_set(f"{SUMMARY}.counts.error", DELETE), "no 'summary.counts.error' field"),
    (_set(f"{SUMMARY}.counts.error", "3"), 'summary.counts.error is "3", not int'),
    (_set(f"{SUMMARY}.counts.error", True), "summary.counts.error is true, not int"),
    (_set(f"{SUMMARY}.metrics.ttft_ms.ok.median", "fast"),
     'summary.metrics.ttft_ms.ok.median is "fast", not float'),
    (_set(f"{SUMMARY}.metrics.ttft_ms.ok.median", float("nan")),
     "summary.metrics.ttft_ms.ok.median is NaN, not float"),
    (_set(f"{SUMMARY}.request_throughput", "x"), 'summary.request_throughput is "x"'),
    (_set(f"{SUMMARY}.request_throughput", None), "summary.request_throughput is null"),
    (_set(f"{SUMMARY}.window_start_ns", "0"), 'summary.window_start_ns is "0", not int'),
    (_set(f"{SUMMARY}.info.label", 5), "summary.info.label is 5, not str"),
    (_set("stages.0.floor.end_ns", 1.5), "floor.end_ns is 1.5, not int"),
    (_set(f"{REQUEST}.chunk_ns", "abc"), 'requests[0].chunk_ns is "abc", not list'),
    (_set(f"{REQUEST}.chunk_ns", [1, "2"]), 'requests[0].chunk_ns[1] is "2", not int'),
    (_set(f"{REQUEST}.start_ns", "abc"), 'requests[0].start_ns is "abc", not int'),
    (_set(f"{REQUEST}.intended_ns", DELETE), "no 'requests[0].intended_ns' field"),
    (_set("stages", {"a": 1}), 'stages is {"a": 1}, not list'),
    (_set("meta", None), "meta is null, not dict"),
])
def test_a_damaged_report_is_a_one_line_error(edit, detail, tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(report()))
    data = copy.deepcopy(report())
    edit(data)
    bad.write_text(json.dumps(data))
    assert main(["bench", "compare", str(bad), str(good), "--fail-on-regression", "10"]) == 2
    err = capsys.readouterr().err
    assert f"bad.json is an incomplete or damaged {FORMAT} report ({detail}" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_intact_report_loads_with_its_nulls(tmp_path):
    data = report()
    data["stages"][0]["floor"] = None  # a run without a floor
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    loaded = load_run(path)
    assert loaded.stages[0].floor is None and len(loaded.stages[0].records) == 4
    assert loaded.stages[0].summary.goodput is None  # null where the writer writes null
    assert loaded.stages[0].records[3].first_token_ns is None


@pytest.mark.parametrize("text, detail", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": ' + "1" * 5000 + "}", "an integer of more than 4300 digits"),
])
def test_json_that_python_cannot_parse_is_a_one_line_error(text, detail, tmp_path, capsys):
    """Once a RecursionError or ValueError traceback: json.loads raises more than
    JSONDecodeError."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["bench", "compare", str(bad), str(bad)]) == 2
    assert capsys.readouterr().err == f"error: {bad}: not valid JSON ({detail})\n"

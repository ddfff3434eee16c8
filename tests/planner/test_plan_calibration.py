"""`--compare-bench`: bench results in several layouts, read and set beside the prediction."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inferlab.cli import main
from inferlab.errors import InferlabError
from inferlab.planner.budget import MemoryConfig
from inferlab.planner.calibration import compare, find_runs
from inferlab.planner.capacity import SLO, Workload
from inferlab.planner.hardware import datasheet_hardware
from inferlab.planner.memory import weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.plan import PlanInputs, build_plan

# statistics dicts per metric, a list of runs at two concurrencies, error latencies present
NESTED = {"runs": [
    {"profile": "concurrent", "concurrency": 1, "prompt_tokens": {"mean": 512, "p50": 500},
     "output_tokens": {"mean": 128}, "ttft_ms": {"mean": 30.0, "p50": 25.0, "p99": 80.0},
     "itl_ms": {"mean": 9.0, "p50": 8.0}, "output_tokens_per_s": 110.0,
     "errors": {"ttft_ms": {"p50": 999.0}}},
    {"profile": "concurrent", "concurrency": 16, "prompt_tokens": {"mean": 512},
     "output_tokens": {"mean": 128}, "ttft_ms": {"p50": 90.0}, "itl_ms": {"p50": 14.0},
     "output_tokens_per_s": 1100.0},
]}
# flat keys with the statistic in the name, one run, a request rate instead of a concurrency
FLAT = {"request_rate": 2.0, "prompt_tokens": 256, "output_tokens": 64, "median_ttft_ms": 40.0,
        "p50_itl_ms": 7.5, "output_throughput": 120.0}
# guidellm-like: metrics under successful / errored
GUIDELLM_LIKE = {"benchmarks": [{"concurrency": 4, "metrics": {
    "time_to_first_token_ms": {"successful": {"median": 33.0}, "errored": {"median": 1.0}},
    "inter_token_latency_ms": {"successful": {"median": 6.0}},
    "output_tokens_per_second": {"successful": {"mean": 500.0}}}}]}



def _inferlab_stage(kind: str, rate: float, max_concurrency: int | None, concurrency_mean: float) -> dict:
    """A stage as `inferlab bench --output X.json` writes it (report_json.py): the spec asked
    for, then the summary measured; prompts of 64 tokens, 16 output tokens."""
    def stats(value: float) -> dict:
        return {"ok": {"count": 8, "mean": value, "median": value}, "error": {"count": 0, "median": None}}

    return {"spec": {"kind": kind, "rate": rate, "max_concurrency": max_concurrency, "seed": 0,
                     "limits": {"max_seconds": None, "max_requests": 8}},
            "summary": {"info": {"stage": 0, "label": f"{kind}@{rate:g}", "kind": kind, "rate": rate},
                        "sent_rate": rate, "scheduled_rate": rate, "request_throughput": rate,
                        "output_token_throughput": 16 * rate, "concurrency_mean": concurrency_mean,
                        "concurrency_max": 2, "metrics": {
                            "ttft_ms": stats(20.0), "itl_ms": stats(5.0),
                            "prompt_tokens": stats(64), "output_tokens": stats(16)}},
            "requests": []}


def _inferlab_result(*stages: dict) -> dict:
    return {"format": "inferlab-bench/1", "meta": {"profile": "constant"}, "stages": list(stages)}


@pytest.fixture(scope="module")
def plan():
    hw = datasheet_hardware("L4")
    return build_plan(PlanInputs(resolve_model("Qwen3-0.6B"), hw, weight_format("bf16"),
                                 MemoryConfig(hw.memory_bytes, runtime_overhead_bytes=2**30),
                                 Workload(), SLO()))


def test_nested_runs_take_medians_and_skip_errors(plan):
    first, second = compare(plan, NESTED)
    assert first.measured == {"ttft_ms": 25.0, "itl_ms": 8.0, "output_tokens_per_s": 110.0}
    assert first.workload == Workload(512, 128) and first.concurrency == 1
    assert second.concurrency == 16 and second.measured["itl_ms"] == 14.0
    # the same workload at 16 streams is predicted slower per token and faster overall
    assert second.predicted["itl_ms"] > first.predicted["itl_ms"]
    assert second.predicted["output_tokens_per_s"] > first.predicted["output_tokens_per_s"]
    assert first.ratio("ttft_ms") == pytest.approx(25.0 / first.predicted["ttft_ms"])


def test_flat_keys_and_a_request_rate(plan):
    (run,) = compare(plan, FLAT)
    assert run.measured == {"ttft_ms": 40.0, "itl_ms": 7.5, "output_tokens_per_s": 120.0}
    assert run.workload == Workload(256, 64)
    assert run.label == "rate 2 req/s" and run.concurrency >= 1


def test_a_rate_limited_run_is_predicted_at_its_measured_concurrency(plan):
    """Once predicted at its cap (--max-concurrency 64) with the replica's full throughput."""
    (run,) = compare(plan, _inferlab_result(_inferlab_stage("constant", 5.0, 64, 0.14)))
    assert run.concurrency == 1 and run.label == "rate 5 req/s, mean concurrency 0.14"
    # served what it offers, far below what one replica can do: 5 req/s × 16 output tokens
    assert run.predicted["output_tokens_per_s"] == pytest.approx(80.0)
    assert run.measured["output_tokens_per_s"] == 80.0


def test_an_overloaded_run_is_predicted_at_capacity(plan):
    overloaded, closed = compare(plan, _inferlab_result(
        _inferlab_stage("poisson", 1000.0, 64, 64.0),
        # a closed loop: inferlab bench writes its 64 streams as its `rate`
        _inferlab_stage("concurrent", 64.0, None, 64.0)))
    assert overloaded.concurrency == closed.concurrency == 64
    assert closed.label == "mean concurrency 64"
    # 1,000 req/s is more than a replica serves at batch 64: both get its capacity, which is
    # more than 64 req/s (the closed loop's stream count, read as a rate)
    assert overloaded.predicted == closed.predicted
    assert 64 * 16 < closed.predicted["output_tokens_per_s"] < 1000 * 16


def test_guidellm_like_layout(plan):
    (run,) = compare(plan, GUIDELLM_LIKE)
    assert run.measured == {"ttft_ms": 33.0, "itl_ms": 6.0, "output_tokens_per_s": 500.0}
    assert run.concurrency == 4


def test_a_result_without_ttft_is_refused(plan):
    assert find_runs({"foo": [1, 2]}) == []
    with pytest.raises(InferlabError, match="no run with a TTFT"):
        compare(plan, {"foo": 1})


def test_cli_prints_ratios(tmp_path, capsys):
    result = tmp_path / "bench.json"
    result.write_text(json.dumps(NESTED))
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--compare-bench", str(result)]) == 0
    out = capsys.readouterr().out
    assert "Measured (bench) vs predicted (planner)" in out
    assert out.count("ttft_ms") >= 2 and "concurrency 16" in out
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--json", "--compare-bench", str(result)]) == 0
    runs = json.loads(capsys.readouterr().out)["compare_bench"]
    assert [r["concurrency"] for r in runs] == [1, 16]


def test_cli_unreadable_result_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--compare-bench", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json: not valid JSON" in err and err.count("\n") == 1
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--compare-bench",
                 str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such bench result (--compare-bench)" in capsys.readouterr().err
    bad.write_bytes(b"\xff\xfe")  # once a UnicodeDecodeError traceback
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--compare-bench", str(bad)]) == 2
    assert "bad.json: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize("text, detail", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[" + "1" * 5000 + "]", "an integer of more than 4300 digits"),
])
def test_cli_json_python_cannot_parse_is_one_line(text, detail, tmp_path, capsys):
    """Once a RecursionError or ValueError traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["plan", "Qwen3-0.6B", "--hardware", "L4", "--compare-bench", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: --compare-bench: {bad}: not valid JSON ({detail})\n"


def test_non_finite_figures_are_no_figures(plan):
    """NaN and 1e400 (inf) parse as JSON numbers; once a traceback converting them to a batch."""
    (run,) = compare(plan, json.loads('{"ttft_ms": {"p50": 10}, "prompt_tokens": NaN, '
                                      '"concurrency": 1e400, "itl_ms": NaN}'))
    assert run.workload == plan.inputs.workload and run.label.startswith("single stream")
    assert run.measured["ttft_ms"] == 10 and run.measured["itl_ms"] is None


def test_a_real_inferlab_bench_result(tmp_path, capsys, shared_file):
    """`inferlab bench` against its mock server (50 ms TTFT, 10 ms ITL) at 1 and 4 streams."""
    text = shared_file("wikitext-2-raw/wiki.test.raw")  # what prompts are cut from (or skip)
    inferlab = [sys.executable, "-m", "inferlab.cli"]
    mock = subprocess.Popen([*inferlab, "bench", "mock-server", "--port", "0", "--ttft-ms", "50",
                             "--itl-ms", "10"], stdout=subprocess.PIPE, text=True)
    try:
        url = mock.stdout.readline().split()[-1]
        result, rated = tmp_path / "bench.json", tmp_path / "rated.json"
        for load, path in ((["concurrent", "--rate", "1", "4", "--max-requests", "8"], result),
                           (["constant", "--rate", "2", "--max-concurrency", "64", "--max-requests", "4"],
                            rated)):
            done = subprocess.run(
                [*inferlab, "bench", "--target", url, "--profile", *load, "--max-tokens", "16",
                 "--calibration-seconds", "0", "--data", "prompt_tokens=64,output_tokens=16",
                 "--data-file", str(text), "--output", str(path), "--quiet"],
                capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
    finally:
        mock.terminate()
        mock.wait(timeout=30)
    assert main(["plan", "--hardware", "L4", "--json", "--compare-bench", str(rated)]) == 0
    (run,) = json.loads(capsys.readouterr().out)["compare_bench"]
    # 2 req/s of 200 ms requests: under one in flight, not the cap of 64; 2 × 16 tokens/s
    assert run["concurrency"] == 1 and run["run"].startswith("rate 2 req/s, mean concurrency")
    assert run["predicted"]["output_tokens_per_s"] == pytest.approx(32.0)
    assert main(["plan", "--hardware", "L4", "--json", "--compare-bench", str(result)]) == 0
    runs = json.loads(capsys.readouterr().out)["compare_bench"]
    assert [r["concurrency"] for r in runs] == [1, 4]
    for run in runs:
        assert run["measured"]["ttft_ms"] == pytest.approx(50, rel=0.3)
        assert run["measured"]["itl_ms"] == pytest.approx(10, rel=0.3)
        assert run["measured"]["output_tokens_per_s"] > 0
        assert run["workload"]["output_tokens"] == 16


def test_a_run_longer_than_the_model_is_refused(plan):
    """Once predicted a 1e9-token prompt on Qwen3-0.6B (40,960 tokens at most) without a word."""
    with pytest.raises(InferlabError, match="exceeds Qwen3-0.6B's maximum context of 40960"):
        compare(plan, {"ttft_ms": {"p50": 10}, "prompt_tokens": 1e9, "output_tokens": 16})


def test_a_run_is_capped_by_its_own_workload_not_the_plans():
    """A run of 64 + 16 tokens at a mean concurrency of 64 beside a plan for prompts of 4,096:
    steps of 768 keep 768 × 16 / 4,112 = 2 of the plan's sequences up, but 768 × 16 / 80 = 153
    of the run's; it was once predicted at concurrency 2."""
    hw = datasheet_hardware("L4")
    long_prompts = build_plan(PlanInputs(resolve_model("Qwen3-0.6B"), hw, weight_format("bf16"),
                                         MemoryConfig(hw.memory_bytes, runtime_overhead_bytes=2**30),
                                         Workload(4096, 16), SLO()))
    assert long_prompts.max_batch == 2
    (run,) = compare(long_prompts, _inferlab_result(_inferlab_stage("concurrent", 64.0, None, 64.0)))
    assert run.workload == Workload(64, 16) and run.concurrency == 64

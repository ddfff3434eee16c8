"""`inferlab bench` from the command line: a mock server and a run as real processes,
and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from bench_helpers import closed_stdout_exit_code

from inferlab.bench import dataspec
from inferlab.bench.report_csv import header
from inferlab.cli import main


@pytest.fixture
def mock_cli():
    """`inferlab bench mock-server --port 0` as a subprocess; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferlab.cli", "bench", "mock-server", "--port", "0",
         "--ttft-ms", "10", "--itl-ms", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("mock server listening on http://127.0.0.1:"), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_run_from_the_command_line_writes_json_and_csv(mock_cli, corpus, tmp_path):
    out_json, out_csv = tmp_path / "run.json", tmp_path / "run.csv"
    done = subprocess.run(
        [sys.executable, "-m", "inferlab.cli", "bench", "--target", mock_cli,
         "--profile", "constant", "--rate", "10", "20", "--max-seconds", "1",
         "--data", "prompt_tokens=16,output_tokens=4", "--data-file", str(corpus),
         "--calibration-seconds", "0.5", "--quiet", "--output", str(out_json),
         "--output", str(out_csv)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "constant@10/s" in done.stdout and "ttft_ms: time to first token" in done.stdout
    report = json.loads(out_json.read_text())
    assert report["meta"]["model"] == "mock-model"  # taken from /v1/models
    assert [len(s["requests"]) for s in report["stages"]] == [10, 20]
    assert all(s["floor"] is not None for s in report["stages"])
    assert "itl_ms" in report["definitions"]
    with out_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == header()
    assert [r["label"] for r in rows] == ["constant@10/s", "constant@20/s"]
    assert [int(r["ok"]) for r in rows] == [10, 20]
    assert float(rows[1]["floor_ttft_ms_median"]) < float(rows[1]["ttft_ms_median"])


def _wait_for_prompts(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Block until the mock has looked up a prompt: a fixed sleep raced a loaded CI machine,
    where start-up alone could outlast it and the interrupt then came before any stage."""
    give_up_at = time.monotonic() + timeout_s
    while time.monotonic() < give_up_at and proc.poll() is None:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        if re.search(r"^vllm:prefix_cache_queries_total\S* [1-9]", text, re.MULTILINE):
            return
        time.sleep(0.1)
    pytest.fail("the bench run sent no prompt")


def _constant_run(mock_cli: str, corpus, out_json, rate: int, output_tokens: int) -> subprocess.Popen:
    """`inferlab bench` at a constant rate for up to a minute, once it has sent a prompt."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferlab.cli", "bench", "--target", mock_cli,
         "--profile", "constant", "--rate", str(rate), "--max-seconds", "60",
         "--data", f"prompt_tokens=16,output_tokens={output_tokens}", "--data-file", str(corpus),
         "--quiet", "--output", str(out_json)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # as in a terminal: a suite started in the background (`make test &`) ignores SIGINT,
        # and its children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_prompts(mock_cli, proc)
    return proc


def test_ctrl_c_stops_the_run_and_still_writes_the_report(mock_cli, corpus, tmp_path):
    out_json = tmp_path / "run.json"
    proc = _constant_run(mock_cli, corpus, out_json, rate=20, output_tokens=4)
    time.sleep(1.5)  # ~30 requests at 20/s: the stage is well under way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    report = json.loads(out_json.read_text())
    assert report["interrupted"] is True
    (stage,) = report["stages"]
    assert stage["summary"]["info"]["stop_reason"] == "interrupted"
    assert stage["summary"]["counts"]["ok"] >= 10
    assert report["stages"][0]["floor"] is None  # no calibration after an interrupt


def test_ctrl_c_pressed_again_and_again_still_writes_the_report(mock_cli, corpus, tmp_path):
    """Once a second press landing inside a pipe read left it out of step: the run hung on a
    read of garbage length, died with a traceback or exited 130 having written nothing."""
    out_json = tmp_path / "run.json"
    proc = _constant_run(mock_cli, corpus, out_json, rate=40, output_tokens=64)
    time.sleep(1.0)
    for _ in range(40):  # presses 5 ms apart, through the stop and the writing of the results
        if proc.poll() is not None or out_json.exists():
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.005)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    report = json.loads(out_json.read_text())
    assert report["interrupted"] is True and report["stages"][0]["summary"]["counts"]["ok"] >= 1


SYNC2 = ["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous",
         "--max-requests", "2"]


@pytest.mark.parametrize("argv, message", [
    (["bench"], "needs --target"),
    # once started processes until memory ran out
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--workers", "100000"],
     "--workers must be in [1, 64]"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "constant"], "needs --rate"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--data",
      "prompt_tokens=8"], "output_tokens"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--output", "r.txt"],
     "use a .json, .csv or .html name"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous"],
     "--max-seconds or --max-requests"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous",
      "--max-requests", "1"], "cannot reach http://127.0.0.1:9/v1/models"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--slo-search"],
     "--slo-search needs --slo"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--warmup", "soon"],
     "bad --warmup 'soon'"),
    # non-finite and huge durations become ns timers: refused, naming the flag
    (SYNC2 + ["--warmup", "nan"], "--warmup must be >= 0 and at most 31536000 seconds"),
    (SYNC2 + ["--warmup", "inf"], "--warmup must be >= 0 and at most 31536000 seconds"),
    (SYNC2 + ["--warmup", "nan%"], "--warmup as a fraction must be in [0, 1), got nan"),
    (SYNC2 + ["--cooldown", "inf"], "--cooldown must be >= 0 and at most"),
    # once accepted and ignored: --ramp-up spreads closed-loop streams only
    (SYNC2 + ["--ramp-up", "2"], "--profile synchronous takes no --ramp-up"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "constant", "--rate", "10",
      "--ramp-up", "2"], "--profile constant takes no --ramp-up"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "poisson", "--rate", "10",
      "--sweep-size", "4"], "--sweep-size shapes a sweep; --profile poisson takes none"),
    (SYNC2 + ["--sweep-sync-seconds", "3"], "--sweep-sync-seconds shapes a sweep"),
    (SYNC2 + ["--ramp-up", "nan"], "--ramp-up must be >= 0 and at most"),
    (SYNC2 + ["--ramp-up", "inf"], "--ramp-up must be >= 0 and at most"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--drain-seconds",
      "nan"], "--drain-seconds must be >= 0 and at most"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1e300"],
     "--max-seconds must be > 0 and at most 31536000 seconds (a year), got 1e+300"),
    (SYNC2 + ["--request-timeout", "inf"], "--request-timeout must be > 0 and at most"),
    (SYNC2 + ["--scrape-interval", "nan"], "--scrape-interval must be > 0 and at most"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "constant", "--rate", "1e-300",
      "--max-requests", "2"], "--rate values must be at least 3.17e-08 (one request a year)"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "constant", "--rate", "1e7",
      "--max-seconds", "10"], "--rate values above 100,000 req/s are more than one load tester"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "concurrent", "--rate", "1e300",
      "--max-requests", "2"], "--rate values above 10,000 streams"),
    (SYNC2 + ["--extra-body", '{"stream": false}'],
     "--extra-body cannot set 'stream': the load tester sets it"),
    (SYNC2 + ["--extra-body", '{"prompt": "hi"}'], "--extra-body cannot set 'prompt'"),
    (SYNC2 + ["--extra-body", "[" * 100_000], "--extra-body: not valid JSON (nested too deeply)"),
    (SYNC2 + ["--data", "prompt_tokens=8,output_tokens=0"],
     "--data output_tokens must be >= 1, got 0"),
    (SYNC2 + ["--data", "prompt_tokens=8,output_tokens=4,output_tokens_max=0"],
     "--data output_tokens_max must be >= 1, got 0"),
    # a length no server takes, which cutting prompts of would exhaust the memory
    (SYNC2 + ["--data", "prompt_tokens=1e10,output_tokens=3"],
     "--data prompt_tokens must be at most 1,048,576 tokens, got 1e10"),
    # an --output that cannot be written fails before the run, which would reach no server
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--output",
      "folder.json"], "--output folder.json: cannot write (Is a directory)"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--output",
      "/proc/r.json"], "--output /proc/r.json: cannot write"),
    (["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous",
      "--max-requests", "1", "--output", "new.json"], "cannot reach"),  # and no new.json
    (["bench", "compare", "folder.json", "r.json"], "folder.json: is a directory, not a file"),
    (["bench", "compare", "latin1.json", "r.json"], "latin1.json: not UTF-8 text"),
    (["bench", "compare", "no_stages.json", "r.json"],
     "no_stages.json is an incomplete or damaged inferlab-bench/1 report (no 'stages' field)"),
    # once compared as an empty table, and passed --fail-on-regression
    (["bench", "compare", "empty.json", "r.json", "--fail-on-regression", "0"],
     "empty.json is an incomplete or damaged inferlab-bench/1 report (it has no stages)"),
    (["bench", "compare", "no_summary.json", "r.json"],
     "no_summary.json is an incomplete or damaged inferlab-bench/1 report (no 'summary' "
     "field)"),
    # compare's --output and thresholds are checked before the (missing) reports are read
    (["bench", "compare", "r.json", "r.json", "--output", "nope/c.html"],
     "folder nope does not exist"),
    (["bench", "compare", "r.json", "r.json", "--output", "folder.html"],
     "compare --output folder.html: cannot write (Is a directory)"),
    (["bench", "compare", "r.json", "r.json", "--fail-on-regression", "-5"],
     "--fail-on-regression must be a percentage >= 0, got -5.0"),
    (["bench", "compare", "r.json", "r.json", "--fail-on-regression", "nan"],
     "--fail-on-regression must be a percentage >= 0, got nan"),
    (["bench", "compare", "r.json", "r.json", "--alpha", "2"], "--alpha must be in (0, 1)"),
    (["bench", "compare", "r.json", "r.json", "--alpha", "-1"], "--alpha must be in (0, 1)"),
    (["bench", "--target", "http://127.0.0.1:abc", "--profile", "synchronous",
      "--max-requests", "1"], "bad --target 'http://127.0.0.1:abc'"),
    (["bench", "--target", "http://[::1", "--profile", "synchronous", "--max-requests", "1"],
     "bad --target 'http://[::1'"),
    (["bench", "--target", "http://a..b", "--profile", "synchronous", "--max-requests", "1"],
     "bad --target 'http://a..b'"),  # httpx's UnicodeError from the host's IDNA encoding
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--api-key", "日本"],
     "--api-key must be ASCII"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--header", "X-A:日本"],
     "--header X-A: HTTP header names and values must be ASCII"),
    # key=value items read as --slo's and the planner's do; a key given twice once silently
    # took the second value
    (SYNC2 + ["--header", "X-A"], "bad --header item 'X-A': expected NAME:VALUE"),
    (SYNC2 + ["--header", "X-A:1", "--header", "X-A:2"],
     "bad --header item 'X-A:2': X-A is given twice"),
    # HTTP names ignore case: both values once went out under one name
    (SYNC2 + ["--header", "X-A:1", "--header", "x-a:2"],
     "bad --header item 'x-a:2': x-a is given twice"),
    (SYNC2 + ["--data", "prompt_tokens=8,output_tokens"],
     "bad --data item 'output_tokens': expected key=value"),
    (SYNC2 + ["--data", "prompt_tokens=8,output_tokens=2,prompt_tokens=9"],
     "bad --data item 'prompt_tokens=9': prompt_tokens is given twice"),
    # the JSON form alike (json.loads kept the last value)
    (SYNC2 + ["--data", '{"prompt_tokens": 8, "output_tokens": 2, "prompt_tokens": 9}'],
     """bad --data item '"prompt_tokens": 9': prompt_tokens is given twice"""),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--data",
      "prompt_tokens=nan,output_tokens=8"], "bad --data value for prompt_tokens: 'nan'"),
    (["bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", "--data",
      "prompt_tokens=inf,output_tokens=8"], "bad --data value for prompt_tokens: 'inf'"),
    (["bench", "mock-server", "--port", "70000"], "port must be in [0, 65535], got 70000"),
    (["bench", "mock-server", "--port", "-1"], "port must be in [0, 65535], got -1"),
])
def test_bad_input_is_a_one_line_error(argv, message, capsys, tmp_path, monkeypatch, corpus):
    monkeypatch.chdir(tmp_path)  # where argv's relative paths point
    # the cases leave out --data-file: their own error, not a missing ../shared/data, is checked
    monkeypatch.setattr(dataspec, "DEFAULT_CORPUS", corpus)
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "folder.html").mkdir()
    (tmp_path / "latin1.json").write_bytes("{\"format\": \"é\"}".encode("latin-1"))
    (tmp_path / "no_stages.json").write_text('{"format": "inferlab-bench/1", "meta": {}}')
    (tmp_path / "empty.json").write_text('{"format": "inferlab-bench/1", "meta": {}, "stages": []}')
    (tmp_path / "no_summary.json").write_text(
        '{"format": "inferlab-bench/1", "meta": {}, "stages": [{"requests": []}]}')
    before = sorted(tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before  # nothing left behind


@pytest.mark.parametrize("flags, message", [
    (["--workers", "0"], "--workers must be in [1, 64], got 0"),
    (["--scrape-interval", "nan"], "--scrape-interval must be > 0"),
    (["--slo-search"], "--slo-search needs --slo"),
    (["--output", "r.txt"], "--output r.txt: use a .json, .csv or .html name"),
    # and still before the server is contacted: port 9 would say "cannot reach"
    ([], "synthetic prompts are cut from real text, by default"),
])
def test_flag_errors_come_before_a_missing_default_corpus(flags, message, monkeypatch, tmp_path,
                                                          one_line_error):
    """A missing ../shared/data once hid each of these: the user was told to get text for
    prompts, fixed that, and only then heard of the flag they had got wrong."""
    monkeypatch.setattr(dataspec, "DEFAULT_CORPUS", tmp_path / "absent.raw")
    err = one_line_error("bench", "--target", "http://127.0.0.1:9", "--max-seconds", "1", *flags)
    assert message in err


def test_a_closed_stdout_loses_no_report(mock_server, corpus, tmp_path):
    report, page = tmp_path / "r.json", tmp_path / "c.html"
    assert closed_stdout_exit_code(
        ["bench", "--target", mock_server(), "--profile", "synchronous", "--max-requests", "3",
         "--data", "prompt_tokens=8,output_tokens=4", "--data-file", str(corpus),
         "--calibration-seconds", "0", "--quiet", "--output", str(report)]) == 0
    assert len(json.loads(report.read_text())["stages"][0]["requests"]) == 3
    # not 1, compare's "regression found"; and its page is written too
    assert closed_stdout_exit_code(
        ["bench", "compare", str(report), str(report), "--output", str(page)]) == 0
    assert "<svg" in page.read_text()


@pytest.mark.parametrize("name", ["prompts.jsonl", "sharegpt.json"])
def test_a_data_file_that_is_not_utf8_is_named(name, mock_server, tmp_path, capsys):
    data = tmp_path / name
    data.write_bytes(b'{"prompt": "caf\xe9"}\n')  # latin-1
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous",
            "--max-requests", "1", "--data", str(data), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{data}: not UTF-8 text" in err and err.count("\n") == 1


def test_missing_data_file_is_named(mock_server, tmp_path, capsys):
    url = mock_server()
    argv = ["bench", "--target", url, "--profile", "synchronous", "--max-requests", "1",
            "--data-file", str(tmp_path / "none.txt"), "--quiet"]
    assert main(argv) == 2
    assert "--data-file not found" in capsys.readouterr().err


def test_a_model_the_server_does_not_list_is_named(mock_server, corpus, capsys):
    # every request would fail with HTTP 404 and the run would still exit 0
    argv = ["bench", "--target", mock_server(), "--model", "nosuch", "--profile",
            "synchronous", "--max-requests", "1", "--data-file", str(corpus), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: --model 'nosuch' is not served at " + argv[2] + "; it serves: " \
                  "mock-model\n"


def test_mock_server_port_in_use_is_a_user_error(mock_server, capsys):
    port = mock_server().rsplit(":", 1)[1]
    assert main(["bench", "mock-server", "--port", port]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_run_where_every_request_failed_exits_1_and_keeps_its_report(mock_server, corpus,
                                                                       tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["bench", "--target", mock_server(error_rate=1.0), "--profile", "synchronous",
            "--max-requests", "3", "--data-file", str(corpus), "--quiet", "--output", str(out)]
    assert main(argv) == 1
    assert "error: every request failed (3); the first: HTTP 500: injected error\n" \
        in capsys.readouterr().err
    assert [r["outcome"] for r in json.loads(out.read_text())["stages"][0]["requests"]] \
        == ["error"] * 3


def test_a_run_with_one_request_through_exits_0(mock_server, corpus, capsys):
    argv = ["bench", "--target", mock_server(error_rate=0.5, seed=3), "--profile",
            "synchronous", "--max-requests", "8", "--data-file", str(corpus), "--quiet"]
    assert main(argv) == 0
    assert "every request failed" not in capsys.readouterr().err

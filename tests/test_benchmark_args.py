"""The benchmark scripts refuse bad arguments when parsed: argparse's usage line and one error
line, exit 2, no traceback, nothing printed or written, in seconds (before any model loads or
any run starts; a zero count used to crash after a minute, a missing --json folder after the
whole run). The shared argparse types of benchmarks/workloads.py are checked directly too."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
TIMEOUT_S = 60  # a refused argument takes the imports' few seconds; a run goes on for minutes

sys.path.insert(0, str(BENCHMARKS))
from workloads import bounded_float, bounded_int, output_file, scheme_list, script_parser  # noqa: E402


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    """A copy of benchmarks/: a script that wrongly starts writes below the copy (accuracy_table.py
    writes beside its own folder), not into the checkout's out/."""
    folder = tmp_path_factory.mktemp("bench") / "benchmarks"
    shutil.copytree(BENCHMARKS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


REFUSED = [  # script, arguments, what the error line says
    ("accuracy_table.py", ["--limit", "0"], "argument --limit: must be an integer >= 1, got 0"),
    ("accuracy_table.py", ["--limit", "-1"], "argument --limit: must be an integer >= 1, got -1"),
    ("accuracy_table.py", ["--only", "bogus"], "argument --only: invalid choice: 'bogus'"),
    ("accuracy_table.py", ["--only"], "argument --only: expected at least one argument"),
    ("accuracy_table.py", ["--out-dir", "/proc/x"], "argument --out-dir: cannot create /proc/x/full"),
    ("eval_speed.py", ["--windows", "0"], "argument --windows: must be an integer >= 1"),
    ("eval_speed.py", ["--seq-len", "0"], "argument --seq-len: must be an integer >= 2"),
    ("gemm.py", ["--rounds", "0"], "argument --rounds: must be an integer >= 1"),
    ("gemm.py", ["--rows", "16", "-1"], "argument --rows: must be an integer >= 1, got -1"),
    ("attention.py", ["--rounds", "0"], "argument --rounds: must be an integer >= 1"),
    ("bench_client_floor.py", ["--json", "/nonexistent/dir/x.json"],
     "argument --json: /nonexistent/dir/x.json: folder /nonexistent/dir does not exist"),
    ("bench_client_floor.py", ["--seconds", "0.5", "--max-workers", "1"],
     "argument --seconds: must be a finite number > 0.5"),
    ("bench_client_floor.py", ["--seconds", "nan"], "argument --seconds: must be a finite number"),
    ("bench_client_floor.py", ["--seconds", "-1"], "argument --seconds: must be a finite number"),
    ("quant_speed.py", ["--json", "/nonexistent/x.json"], "argument --json: /nonexistent/x.json: folder /nonexistent does not exist"),
    ("gpu.py", ["--json", "/nonexistent/x.json"], "argument --json: /nonexistent/x.json: folder /nonexistent does not exist"),
    ("offline_throughput.py", ["--output-tokens", "1"], "argument --output-tokens: must be an "
                                                        "integer >= 2"),
    ("plan_vs_engine.py", ["--threads", "100000"], "argument --threads: must be an integer from 1"),
    ("spec_decode.py", ["--lookup-min", "4"], "argument --lookup-min: at most --lookup-max (3)"),
    ("kv_steady_state.py", ["--block-sizes", "24"],
     "argument --block-sizes: a block size is a power of two, not 24"),
    ("vs_llamacpp.py", ["--llama-bench", "/nonexistent/llama-bench"],
     "argument --llama-bench: /nonexistent/llama-bench is not a file"),
    ("kv_steady_state.py", ["--waves", "1"], "argument --waves: must be an integer >= 2, got 1"),
    ("quant_speed.py", ["--schemes", "W8A16,BOGUS"], "argument --schemes: 'BOGUS' is not one of"),
    ("quant_speed.py", ["--schemes", "FP8"], "argument --schemes: 'FP8' is not one of"),
    ("quant_speed.py", ["--warm-steps", "-1"], "argument --warm-steps: must be an integer >= 0, got -1"),
    ("linear_floor.py", ["--schemes", "W4A17"], "argument --schemes: 'W4A17' is not one of"),
    ("linear_floor.py", ["/nonexistent"], "argument model: /nonexistent: no such file or directory"),
    ("cpu_serving.py", ["--model", "/nonexistent"], "argument --model: /nonexistent: no such file"),
    ("profile_decode.py", ["--context", "9000"], "argument --context: the model's context holds 8192 "
                                                 "tokens, 88 of them output: at most 8104, got 9000"),
]


@pytest.fixture(scope="module")
def refusals(scripts) -> list[dict]:
    """Each REFUSED case's exit code, stdout and stderr, all run by one driver process (a script
    still running after TIMEOUT_S is stopped there and reported as such)."""
    cases = json.dumps([[script, args] for script, args, _ in REFUSED])
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "benchmark_args_driver.py"),
                           str(scripts), str(TIMEOUT_S)], input=cases, cwd=scripts.parent,
                          capture_output=True, text=True, timeout=TIMEOUT_S * len(REFUSED))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("case", "script", "message"), [(i, s, m) for i, (s, _, m) in enumerate(REFUSED)],
                         ids=[f"{s} {' '.join(a)}" for s, a, _ in REFUSED])
def test_a_bad_argument_is_refused_when_parsed(scripts, refusals, case, script, message) -> None:
    done = refusals[case]
    assert "Traceback" not in done["stderr"], done["stderr"]
    assert done["returncode"] == 2, (done["returncode"], done["stdout"][-2000:], done["stderr"][-2000:])
    assert done["stdout"] == ""  # nothing started: no machine line, no figures
    lines = done["stderr"].strip().splitlines()
    assert lines[0].startswith(f"usage: {script}")
    assert [line for line in lines if ": error: " in line] == [lines[-1]]
    assert lines[-1].startswith(f"{script}: error: {message}"), lines[-1]
    assert not (scripts.parent / "out").exists()


def test_bounded_int() -> None:
    parse = bounded_int(2, 8)
    assert parse("2") == 2 and parse("8") == 8
    for text, error in [("1", "from 2 to 8, got 1"), ("9", "got 9"), ("1.5", "not an integer"),
                        ("x", "not an integer")]:
        with pytest.raises(argparse.ArgumentTypeError, match=error):
            parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1, got 0"):
        bounded_int(1)("0")


def test_bounded_float() -> None:
    parse = bounded_float(0.5, 100)
    assert parse("0.75") == 0.75 and parse("100") == 100
    for text in ("0.5", "-1", "100.5", "nan", "inf", "-inf"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"finite number > 0\.5 and at most 100"):
            parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
        parse("fast")


def test_output_file(tmp_path) -> None:
    new = tmp_path / "new.json"
    assert output_file(str(new)) == str(new)
    assert not new.exists()  # tried, and not left behind
    old = tmp_path / "old.json"
    old.write_text("figures")
    assert output_file(str(old)) == str(old)
    assert old.read_text() == "figures"
    for path, error in [(tmp_path / "no" / "x.json", "folder .* does not exist"),
                        (tmp_path, "Is a directory"), (Path("/proc/x.json"), "cannot write")]:
        with pytest.raises(argparse.ArgumentTypeError, match=error):
            output_file(str(path))


def test_scheme_list() -> None:
    parse = scheme_list(("W8A16", "W4A16"))
    assert parse("w4a16, W8A16") == ["W4A16", "W8A16"]
    for text, error in [("W8A8", "'W8A8' is not one of W8A16, W4A16"), ("W8A16,", "'' is not one of")]:
        with pytest.raises(argparse.ArgumentTypeError, match=error):
            parse(text)


def test_help_shows_the_whole_docstring() -> None:
    doc = """A first line that goes on
onto a second.

    python script.py --flag
"""
    assert doc in script_parser(doc).format_help()


def test_a_server_that_exits_at_once_fails_at_once() -> None:
    """A bad `inferlab serve` option: the server's own error and one line saying so, in the
    seconds its start takes (it once waited 300 s for /health, its stderr thrown away)."""
    from cpu_serving import free_port, serving

    with pytest.raises(SystemExit) as exited, serving(free_port(), "bfloat16", 1, extra=("--bogus-flag",)):
        pytest.fail("the server came up")
    message = str(exited.value.code)
    assert "unrecognized arguments: --bogus-flag" in message
    assert message.splitlines()[-1].endswith("exited with code 2 before it was healthy (its stderr ends above)")

"""`inferlab bench` inputs read and dealt as guidellm and vLLM treat them.

References: Python's universal newlines (guidellm reads a .txt with open().readlines(): a
line ends at "\\r", "\\n" or "\\r\\n", not at U+2028 or a form feed); pandas.read_csv, which
renames a repeated column `prompt` to `prompt.1` so guidellm's column mapper takes the first;
vLLM's ChatCompletionRequest, where max_completion_tokens wins over max_tokens; and the
contract of --max-requests N over a file of N prompts: each prompt is sent once.
"""

from __future__ import annotations

import json

import pytest
from bench_helpers import bench_config, run, with_workers

from inferlab.bench.config import StageLimits
from inferlab.bench.datasets import load_file
from inferlab.bench.pool import split_stage
from inferlab.bench.profiles import StageSpec
from inferlab.bench.tokens import TokenCounter
from inferlab.bench.worker import _stream_index
from inferlab.cli import main


def prompts_of(tmp_path, name: str, content: str):
    path = tmp_path / name
    path.write_text(content, newline="")
    return load_file(str(path), TokenCounter(None), 8)


# --- 1. a .txt file's lines end as open().readlines() ends them

def test_cr_only_line_ends_split_a_text_file(tmp_path):
    rows = prompts_of(tmp_path, "cr.txt", "p0\rp1\r\rp2\r\np3\n\u2028keep\x0cme\x85whole\r")
    assert [r.text for r in rows] == ["p0", "p1", "p2", "p3", "\u2028keep\x0cme\x85whole"]


def test_a_jsonl_line_still_ends_only_at_a_newline(tmp_path):
    # a lone CR is not a line end in JSONL: the record stays whole (JSON allows it as space)
    (row,) = prompts_of(tmp_path, "cr.jsonl", '{"prompt":\r"a"}\r\n')
    assert row.text == "a"


# --- 2. --max-requests N over N prompts sends each once, whatever the workers' shares

@pytest.mark.parametrize("streams, workers, n", [
    (3, 2, 4), (1, 2, 4), (1, 4, 5), (5, 2, 10), (7, 3, 20), (2, 4, 9), (10, 4, 3), (4, 4, 4),
])
def test_closed_loop_request_numbers_cover_0_to_n_minus_1_once(streams, workers, n):
    kind = "synchronous" if streams == 1 else "concurrent"
    spec = StageSpec(kind, None if streams == 1 else float(streams), None,
                     StageLimits(max_requests=n))
    plans = split_stage(spec, stage=0, workers=workers, start_ns=0, ramp_up_s=0)
    numbers = [_stream_index(p, k) for p in plans for k in range(p.max_requests)]
    assert sorted(numbers) == list(range(n))
    assert sum(p.streams for p in plans) == streams


def test_the_first_round_numbers_the_streams_in_their_ramp_up_order():
    # stream s (of all workers) starts s-th under --ramp-up and takes request s first
    spec = StageSpec("concurrent", 5.0, None, StageLimits(max_requests=10))
    plans = split_stage(spec, stage=0, workers=2, start_ns=0, ramp_up_s=0)
    firsts = [[_stream_index(p, k) for k in range(p.streams)] for p in plans]
    assert firsts == [[0, 1], [2, 3, 4]]


@pytest.mark.parametrize("profile, rates, limits", [
    ("concurrent", (3,), {}),  # the reported case: p0, p3, p0, p2 were sent
    ("synchronous", (), {}),  # worker 0 has no stream: worker 1 sent p1, p3, p1, p3
    ("throughput", (), {"max_concurrency": 3}),
])
def test_four_requests_over_four_prompts_send_each_once(mock_server, corpus, tmp_path,
                                                        profile, rates, limits):
    data = tmp_path / "four.jsonl"  # each prompt's max_tokens names it in the records
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "max_tokens": i + 1}) + "\n"
                            for i in range(4)))
    config = bench_config(mock_server(ttft_ms=5, itl_ms=1), corpus, profile, rates,
                          data=str(data), max_requests=4, max_seconds=None, **limits)
    (stage,) = run(with_workers(config, 2)).stages
    assert sorted(r.output_tokens_asked for r in stage.records) == [1, 2, 3, 4]


# --- 3. max_completion_tokens would override the max_tokens the load tester sets

def test_extra_body_cannot_set_max_completion_tokens(capsys):
    argv = ["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous",
            "--max-requests", "2", "--extra-body", '{"max_completion_tokens": 3}']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == ("error: --extra-body cannot set 'max_completion_tokens': the load tester "
                   "sets max_tokens, which it overrides (use --data or --max-tokens)\n")


# --- 4. a repeated CSV column name: the first column, as pandas' renaming leaves it

def test_a_repeated_csv_column_takes_the_first(tmp_path):
    (row,) = prompts_of(tmp_path, "dup.csv", "prompt,prompt\nfirst,second\n")
    assert row.text == "first"
    # the repeat of a count column too
    (row,) = prompts_of(tmp_path, "dupc.csv",
                        "prompt,max_tokens,max_tokens\nhello,5,9\n")
    assert row.output_tokens == 5

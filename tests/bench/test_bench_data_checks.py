"""`inferlab bench` checks around file and synthetic data: per-request ignore_eos checks,
long arguments, repeated file prompts, and guidellm's bounds on synthetic lengths.

References: vLLM's ignore_eos (a request sent with it returns exactly max_tokens tokens),
guidellm's SyntheticTextDatasetConfig (prompt/output tokens and their _min/_max are ints
> 0), Linux's NAME_MAX of 255 bytes, and a server's prefix cache serving a prompt it has seen
(vLLM's automatic prefix caching).
"""

from __future__ import annotations

import json

import pytest
from bench_helpers import bench_config, run
from test_bench_caveats import ok, stage

from inferlab.bench.caveats import stage_warnings
from inferlab.bench.config import DataConfig
from inferlab.bench.dataspec import SyntheticSpec, is_synthetic
from inferlab.cli import main
from inferlab.errors import InferlabError

LONG_SPEC = json.dumps({"prompt_tokens": 16, "prompt_tokens_stdev": 2, "prompt_tokens_min": 8,
                        "prompt_tokens_max": 24, "output_tokens": 3, "output_tokens_stdev": 1,
                        "output_tokens_min": 2, "output_tokens_max": 4, "prefix_tokens": 0},
                       indent=8)


# --- 2. each request sent with ignore_eos is checked, whatever the others

def test_records_say_which_requests_were_sent_with_ignore_eos(tmp_path, mock_server, corpus):
    path = tmp_path / "mix.jsonl"
    path.write_text('{"prompt": "a b", "output_tokens_count": 5}\n'
                    '{"prompt": "c d", "max_tokens": 7}\n')
    result = run(bench_config(mock_server(), corpus, "synchronous", data=str(path),
                              max_seconds=None, max_requests=4))
    (only,) = result.stages
    assert {(r.output_tokens_asked, r.ignore_eos) for r in only.records} == {(5, True),
                                                                              (7, False)}


def test_a_short_counted_row_is_flagged_in_a_mixed_file():
    counted_short, ceiling_short = ok(0, 3, 8), ok(1, 2, 8)
    counted_short.ignore_eos = True  # asked exactly 8 (ignore_eos), returned 3
    records = [counted_short, ceiling_short, ok(2, 8, 8)]
    assert stage_warnings(stage(records), tokenizer=False, forced_length=False) == [
        "1 of 1 successful requests sent with ignore_eos did not return the asked number of "
        "output tokens (does the server honour ignore_eos?)"]
    counted_short.ignore_eos = False  # a ceiling: stopping at EOS is no fault
    assert stage_warnings(stage(records), tokenizer=False, forced_length=False) == []


# --- 3. arguments longer than a file name

def test_a_json_spec_longer_than_a_file_name_is_a_spec(corpus, mock_server, tmp_path):
    assert len(LONG_SPEC) > 255 and is_synthetic(LONG_SPEC)
    assert SyntheticSpec.parse(LONG_SPEC).output.max == 4
    DataConfig(LONG_SPEC, str(corpus))  # checked at build, no OSError
    report = tmp_path / "r.json"
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous", "--max-requests",
            "1", "--data", LONG_SPEC, "--data-file", str(corpus), "--quiet",
            "--calibration-seconds", "0", "--scrape-interval", "0", "--output", str(report)]
    assert main(argv) == 0
    assert json.loads(report.read_text())["meta"]["data"].startswith("synthetic {")


@pytest.mark.parametrize("flag, value, message", [
    ("--tokenizer", "x" * 300, "no such file or folder"),
    ("--data", "/tmp/" + "y" * 300 + ".jsonl", "is neither a synthetic spec"),
    ("--data-file", "/tmp/" + "z" * 300, "--data-file not found"),
    ("--data", "/tmp/" + "d/" * 3000 + "a.jsonl", "is neither a synthetic spec"),
])
def test_paths_longer_than_a_file_name_are_one_line_errors(flag, value, message, capsys,
                                                           corpus):
    args = {"--data": "prompt_tokens=8,output_tokens=2", "--data-file": str(corpus),
            flag: value}
    argv = ["bench", "--target", "http://127.0.0.1:9", "--profile", "synchronous",
            "--max-requests", "1", "--quiet"] + [x for kv in args.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


# --- 4. a file prompt sent more than once is served from the prefix cache

def test_repeated_file_prompts_are_a_caveat(tmp_path, mock_server, corpus):
    url = mock_server()
    one = tmp_path / "one.txt"
    one.write_text("the only prompt\n")
    result = run(bench_config(url, corpus, "synchronous", data=str(one), max_seconds=None,
                              max_requests=3))
    assert result.meta["data"] == f"{one} (1 prompt)"
    assert ("1 prompt for 3 requests: repeats are served from the server's prefix cache, "
            "which lowers their TTFT") in result.warnings
    three = tmp_path / "three.txt"
    three.write_text("one\ntwo\nthree\n")
    result = run(bench_config(url, corpus, "synchronous", data=str(three), max_seconds=None,
                              max_requests=3))
    assert result.meta["data"] == f"{three} (3 prompts)"
    assert not any("prefix cache" in w for w in result.warnings)
    # each stage starts again from the first prompt: the second stage's are repeats
    result = run(bench_config(url, corpus, "constant", (20.0, 40.0), data=str(three),
                              max_seconds=None, max_requests=2))
    assert ("2 prompts for 4 requests: repeats are served from the server's prefix cache, "
            "which lowers their TTFT") in result.warnings
    # synthetic prompts carry a unique tag: never a repeat
    result = run(bench_config(url, corpus, "synchronous", data="prompt_tokens=8,output_tokens=2",
                              max_seconds=None, max_requests=3))
    assert not any("prefix cache" in w for w in result.warnings)


# --- 8. guidellm's bounds: whole numbers, and _min/_max > 0

@pytest.mark.parametrize("spec, message", [
    ("prompt_tokens=8,prompt_tokens_min=0,prompt_tokens_max=10,output_tokens=2",
     "--data prompt_tokens_min must be >= 1, got 0"),
    ("prompt_tokens=8,output_tokens=2,output_tokens_min=-3",
     "--data output_tokens_min must be >= 1, got -3"),
    ("prompt_tokens=8,prompt_tokens_max=0,output_tokens=2",
     "--data prompt_tokens_max must be >= 1, got 0"),
    ("prompt_tokens=8.5,output_tokens=2",
     "--data prompt_tokens must be a whole number of tokens, got 8.5"),
    ('{"prompt_tokens": 8, "output_tokens": 2.5}',
     "--data output_tokens must be a whole number of tokens, got 2.5"),
    ("prompt_tokens=8,prompt_tokens_min=4.2,output_tokens=2",
     "--data prompt_tokens_min must be a whole number of tokens, got 4.2"),
])
def test_synthetic_lengths_are_whole_and_positive(spec, message):
    with pytest.raises(InferlabError) as error:
        SyntheticSpec.parse(spec)
    assert str(error.value) == message


def test_whole_floats_and_fractional_stdevs_still_parse():
    spec = SyntheticSpec.parse("prompt_tokens=1e3,output_tokens=2.0,prompt_tokens_stdev=1.5")
    assert (spec.prompt.mean, spec.output.mean, spec.prompt.stdev) == (1000, 2, 1.5)


def test_deep_or_huge_json_specs_are_one_line_errors():
    with pytest.raises(InferlabError, match=r"^--data: not valid JSON \(nested too deeply\)$"):
        SyntheticSpec.parse('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InferlabError, match=r"^--data: not valid JSON \(an integer of more than \d+ digits\)$"):
        SyntheticSpec.parse('{"prompt_tokens": 1' + "0" * 5000 + ', "output_tokens": 2}')

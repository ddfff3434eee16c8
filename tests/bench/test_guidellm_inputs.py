"""`inferlab bench`'s data inputs as guidellm reads them: its file layouts and column names,
its synthetic spec forms and sampling, its flags; and the HTML report's throughput columns.

References: guidellm's docs/guides/datasets.md and GenerativeColumnMapper defaults (text
columns `prompt`, `instruction`...; output counts `output_tokens_count`,
`completion_tokens_count`), its OpenAI backend (a row's output count is sent as max_tokens
with ignore_eos), its IntegerRangeSampler (min/max and no variance: uniform), and
`vllm bench serve` / guidellm sending dataset prompts verbatim.
"""

from __future__ import annotations

import json
import random

import pytest
from bench_helpers import bench_config, run

from inferlab.bench.console import load_table
from inferlab.bench.datasets import Prompt, load_file
from inferlab.bench.dataspec import LengthDist, SyntheticSpec, is_synthetic
from inferlab.bench.report_html import SUMMARY_HEADERS, _summary_table
from inferlab.bench.tags import request_tag
from inferlab.bench.templates import BodyOptions, make_template
from inferlab.bench.tokens import TokenCounter
from inferlab.bench.workload import build_workload
from inferlab.cli import main
from inferlab.errors import InferlabError

TAGS = (request_tag("123456", 0, 1), request_tag("654321", 3, 42))


def bodies(template) -> list[dict]:
    """The request bodies a template gives under two different requests' tags."""
    return [json.loads(template.body(tag)) for tag in TAGS]


def workload_of(tmp_path, corpus, name: str, content: str, **data: object):
    path = tmp_path / name
    path.write_text(content)
    config = bench_config("http://127.0.0.1:9", corpus, "synchronous", data=str(path),
                          **data)
    return build_workload(config, "m")


# --- 1. guidellm's output count columns, sent with ignore_eos

def test_output_count_columns_are_sent_as_exact_lengths(tmp_path, corpus):
    rows = [{"prompt": "Hello there", "output_tokens_count": 5},
            {"prompt": "What is your name?", "completion_tokens_count": 3},
            {"prompt": "A ceiling only", "max_tokens": 7},
            {"prompt": "No length"}]
    workload = workload_of(tmp_path, corpus, "g.jsonl",
                           "\n".join(json.dumps(r) for r in rows) + "\n")
    sent = {b["prompt"]: b for t in workload.templates for b in bodies(t)[:1]}
    assert (sent["Hello there"]["max_tokens"], sent["Hello there"].get("ignore_eos")) == (5, True)
    assert (sent["What is your name?"]["max_tokens"],
            sent["What is your name?"].get("ignore_eos")) == (3, True)
    # max_tokens is a ceiling in the OpenAI API; a row without a length gets --max-tokens
    assert sent["A ceiling only"]["max_tokens"] == 7 and "ignore_eos" not in sent["A ceiling only"]
    assert sent["No length"]["max_tokens"] == 256 and "ignore_eos" not in sent["No length"]
    assert not workload.forced_length  # not every request asks an exact length


def test_a_file_of_output_counts_is_a_forced_length_run(tmp_path, corpus):
    workload = workload_of(tmp_path, corpus, "g.jsonl",
                           '{"prompt": "a b", "output_tokens_count": 4}\n')
    assert workload.forced_length and bodies(workload.templates[0])[0]["ignore_eos"] is True
    # --no-ignore-eos still wins
    off = make_template(load_file(str(tmp_path / "g.jsonl"), TokenCounter(None), 9)[0],
                        BodyOptions("m", chat=False, force_length=False))
    assert "ignore_eos" not in bodies(off)[0]


# --- 2. file prompts are sent verbatim

def test_file_prompts_are_sent_verbatim(tmp_path, corpus, tokenizer_json):
    few_shot = "Q: What is 2+2?\nA:"
    workload = workload_of(tmp_path, corpus, "p.jsonl", json.dumps({"prompt": few_shot}),
                           tokenizer=str(tokenizer_json))
    (template,) = workload.templates
    assert [b["prompt"] for b in bodies(template)] == [few_shot, few_shot]
    # the count is of the prompt as sent: no tag's tokens
    assert template.prompt_tokens == len(TokenCounter(tokenizer_json).encode(few_shot))
    assert not any("tags" in note for note in workload.notes)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hi."}]
    workload = workload_of(tmp_path, corpus, "c.jsonl", json.dumps({"messages": messages}),
                           chat=True)
    assert [b["messages"] for b in bodies(workload.templates[0])] == [messages, messages]


def test_synthetic_prompts_still_carry_their_tag(corpus):
    config = bench_config("http://127.0.0.1:9", corpus, "synchronous",
                          data="prompt_tokens=32,output_tokens=4")
    first = build_workload(config, "m").templates[0]
    one, two = (b["prompt"] for b in bodies(first))
    assert one.startswith(TAGS[0]) and two.startswith(TAGS[1])
    assert one[len(TAGS[0]):] == two[len(TAGS[1]):]


# --- 3. _min/_max without _stdev: uniform, as guidellm's IntegerRangeSampler

def test_min_and_max_without_stdev_sample_uniformly():
    spec = SyntheticSpec.parse("prompt_tokens=100,prompt_tokens_min=50,prompt_tokens_max=150,"
                               "output_tokens=10")
    rng = random.Random(0)
    values = [spec.prompt.sample(rng) for _ in range(5000)]
    assert min(values) == 50 and max(values) == 150
    assert len(set(values)) == 101  # every length of the range drawn, as randint does
    assert abs(sum(values) / len(values) - 100) < 2
    # a bound not given is the mean: guidellm draws in [min, mean] (or [mean, max])
    low = [LengthDist(100, 0.0, 60, None).sample(rng) for _ in range(2000)]
    assert (min(low), max(low)) == (60, 100)
    assert LengthDist(100).sample(rng) == 100  # no bounds, no stdev: fixed


# --- 4. an empty messages list

def test_empty_messages_are_refused_at_load(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"prompt": "fine"}\n{"messages": []}\n')
    with pytest.raises(InferlabError, match=r"^m\.jsonl:2: 'messages' is empty$"):
        load_file(str(path), TokenCounter(None), 8)


def test_empty_messages_are_a_one_line_cli_error(tmp_path, mock_server, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text('{"messages": []}\n')
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous", "--max-requests",
            "1", "--data", str(path), "--quiet", "--calibration-seconds", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "m.jsonl:1: 'messages' is empty" in err and err.count("\n") == 1


# --- 5. the tag's slot marker cannot collide with the prompt

@pytest.mark.parametrize("text", ["a \x00TAG\x00 b", "a \x00TAG0\x00 b", "ends \x00TAG0",
                                  "\x00TAG0\x00TAG1\x00"])
def test_a_prompt_holding_the_slot_marker_is_tagged_in_place(text):
    at = len(text)  # the tag right after the text: next to a marker-like end
    template = make_template(Prompt(text, None, 5, 4, tag_at=at),
                             BodyOptions("m", chat=False, force_length=True))
    assert [b["prompt"] for b in bodies(template)] == [text + tag for tag in TAGS]
    template = make_template(Prompt(text, None, 5, 4, tag_at=0),
                             BodyOptions("m", chat=True, force_length=True,
                                         extra=(("user", "\x00TAG0\x00"),)))
    assert [b["messages"][0]["content"] for b in bodies(template)] == [tag + text
                                                                       for tag in TAGS]


def test_a_file_prompt_holding_nul_tag_nul_is_sent_as_written(tmp_path):
    path = tmp_path / "nul.jsonl"
    path.write_text('{"prompt": "a \\u0000TAG\\u0000 b"}\n')
    (prompt,) = load_file(str(path), TokenCounter(None), 8)
    template = make_template(prompt, BodyOptions("m", chat=False, force_length=None))
    assert bodies(template)[0]["prompt"] == "a \x00TAG\x00 b"


# --- 6. a bool is no token count

@pytest.mark.parametrize("row", ['{"prompt": "x", "output_tokens": true}',
                                 '{"prompt": "x", "max_tokens": false}',
                                 '{"prompt": "x", "output_tokens_count": true}'])
def test_bool_output_lengths_are_refused(tmp_path, row):
    path = tmp_path / "b.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(InferlabError, match=r"b\.jsonl:1: \w+ must be a positive int"):
        load_file(str(path), TokenCounter(None), 8)


# --- 7. ShareGPT turns whose value is null

def test_sharegpt_null_values_are_skipped(tmp_path):
    data = [{"conversations": [{"from": "human", "value": None},
                               {"from": "gpt", "value": "an answer"}]},
            {"conversations": [{"from": "human", "value": "a question"},
                               {"from": "gpt", "value": None}]},
            {"conversations": [{"from": "human", "value": "kept"},
                               {"from": "gpt", "value": "yes it is"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    prompts = load_file(str(path), TokenCounter(None), 8)
    assert [p.messages for p in prompts] == [({"role": "user", "content": "kept"},)]
    path.write_text(json.dumps(data[:1]))
    with pytest.raises(InferlabError, match="no usable prompts"):
        load_file(str(path), TokenCounter(None), 8)


# --- 8. guidellm-style inputs

@pytest.mark.parametrize("spec, key", [
    ("prompt_tokens=5,output_tokens=5,source=x.txt", "source"),
    ("kind=synthetic,prompt_tokens=5,output_tokens=5", "kind"),
])
def test_unknown_spec_keys_are_named_before_their_value(spec, key):
    with pytest.raises(InferlabError, match=rf"unknown --data key '{key}'.*known: prompt_tokens,"):
        SyntheticSpec.parse(spec)


def test_guidellm_json_spec_is_the_same_spec():
    text = '{"prompt_tokens": 256, "output_tokens": 128, "prompt_tokens_stdev": 16}'
    assert is_synthetic(text)
    assert SyntheticSpec.parse(text) == SyntheticSpec.parse(
        "prompt_tokens=256,output_tokens=128,prompt_tokens_stdev=16")
    with pytest.raises(InferlabError, match="bad --data value for prompt_tokens: True"):
        SyntheticSpec.parse('{"prompt_tokens": true, "output_tokens": 1}')


def test_json_list_of_prompt_rows(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "Hello there", "output_tokens_count": 5}, '
                    '{"question": "What?"}]')
    first, second = load_file(str(path), TokenCounter(None), 8)
    assert (first.text, first.output_tokens, first.exact_output) == ("Hello there", 5, True)
    assert (second.text, second.output_tokens, second.exact_output) == ("What?", 8, False)
    path.write_text('[{"prompt": "x"}, 3]')
    with pytest.raises(InferlabError, match="rows.json: item 2: expected an object"):
        load_file(str(path), TokenCounter(None), 8)


def test_csv_files_with_guidellm_columns(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text('prompt,output_tokens_count\nHello there,5\n'
                    '"Two lines, a comma\nand a quote ""q""",\n')
    first, second = load_file(str(path), TokenCounter(None), 8)
    assert (first.text, first.output_tokens, first.exact_output) == ("Hello there", 5, True)
    assert second.text == 'Two lines, a comma\nand a quote "q"'
    assert (second.output_tokens, second.exact_output) == (8, False)  # an empty count cell
    other = tmp_path / "i.csv"
    other.write_text("id,Instruction\n1,Summarise this\n")  # guidellm matches in any case
    assert [p.text for p in load_file(str(other), TokenCounter(None), 8)] == ["Summarise this"]
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,output_tokens_count\nok,4\nnot ok,-1\n")
    with pytest.raises(InferlabError, match=r"bad\.csv:3: output_tokens_count must be a "
                                            r"positive int"):
        load_file(str(bad), TokenCounter(None), 8)


def test_csv_rows_short_long_and_marked(tmp_path):
    path = tmp_path / "edge.csv"
    long_prompt = "word " * 40_000  # 200 kB: past the csv module's default 128 KiB cell
    path.write_text("\ufeffprompt,output_tokens_count\n"  # a spreadsheet's byte order mark
                    f"only a prompt\n{long_prompt},3\n")
    short, long = load_file(str(path), TokenCounter(None), 8)
    assert (short.text, short.output_tokens) == ("only a prompt", 8)
    assert (long.text, long.output_tokens) == (long_prompt, 3)


def test_txt_files_are_one_prompt_a_line(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("Hello there\n\nWhat is your name?\n")
    prompts = load_file(str(path), TokenCounter(None), 8)
    assert [(p.text, p.output_tokens) for p in prompts] == [("Hello there", 8),
                                                           ("What is your name?", 8)]


@pytest.mark.parametrize("extra, message", [
    (["--profile", "sweep", "--rate", "5"], "--profile sweep takes no --rate: its number of "
                                             "stages is --sweep-size"),
    (["--profile", "concurrent", "--rate", "0"],
     "--profile concurrent takes --rate as a whole number of streams >= 1, got [0.0]"),
    (["--profile", "concurrent", "--rate", "-2"], "whole number of streams >= 1"),
    (["--profile", "concurrent", "--rate", "nan"], "whole number of streams >= 1"),
    (["--profile", "synchronous", "--tokenizer", "HuggingFaceTB/SmolLM2-135M"],
     "a Hub model id is not downloaded"),
    (["--profile", "synchronous", "--tokenizer", "."], "the folder holds no tokenizer.json"),
    (["--profile", "synchronous", "--slo", ""], "--slo needs at least one bound"),
    (["--profile", "synchronous", "--slo", "ttft_ms=inf"], "must be a finite number > 0 ms"),
    (["--profile", "synchronous", "--slo", "ttft_ms=50,ttft_ms=60"],
     "bad --slo item 'ttft_ms=60': ttft_ms is given twice"),
    (["--profile", "synchronous", "--slo", "ttft=50"],
     "bad --slo item 'ttft=50': expected ttft_ms=N,itl_ms=N,tpot_ms=N,e2e_ms=N "
     "(milliseconds)"),
    (["--profile", "synchronous", "--slo", "ttft_ms=soon"],
     "bad --slo value for ttft_ms: 'soon' (expected milliseconds)"),
])
def test_guidellm_style_flags_get_guidellm_terms(extra, message, capsys, tmp_path,
                                                 monkeypatch, corpus):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--target", "http://127.0.0.1:9", "--max-requests", "2",
                 "--data-file", str(corpus), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_tokenizer_folder_loads_its_tokenizer_json(mock_server, corpus, tokenizer_json,
                                                   tmp_path):
    report = tmp_path / "r.json"
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous", "--max-requests",
            "1", "--data", "prompt_tokens=24,output_tokens=2", "--data-file", str(corpus),
            "--tokenizer", str(tokenizer_json.parent), "--quiet", "--calibration-seconds",
            "0", "--scrape-interval", "0", "--output", str(report)]
    assert main(argv) == 0
    meta = json.loads(report.read_text())["meta"]
    assert meta["tokenizer"] == str(tokenizer_json)
    assert not any("no --tokenizer" in note for note in meta["notes"])


# --- 9. the HTML summary holds the console's total tok/s

def test_html_summary_has_the_console_total_token_throughput(mock_server, corpus):
    result = run(bench_config(mock_server(), corpus, "synchronous", max_seconds=None,
                              max_requests=3, data="prompt_tokens=16,output_tokens=4"))
    console = load_table(result)
    column = next(c for c in console.columns if c.header == "total tok/s")
    (printed,) = column._cells
    html = _summary_table(result.stages)
    assert "total tok/s" in SUMMARY_HEADERS
    cells = html.split("</tr>")[1].removeprefix("<tr>").split("</td>")
    value = cells[SUMMARY_HEADERS.index("total tok/s")].split(">")[-1]
    assert value == printed and float(printed.replace(",", "")) > 0

"""`inferlab bench --data FILE` rows read as guidellm reads them.

References: guidellm's GenerativeColumnMapper (src/guidellm/data/preprocessors/mappers.py:
prefix columns `system_prompt`, `system`, `prefix`; a column type is the first column, in
the dataset's column order, whose name matches one of its names in any case, in the plural),
its OpenAI request handlers (completions send `" ".join([prefix, text])`, chat a
`{"role": "system"}` message before the user's), GenerativeRequestFinalizer.finalize_turn
(only truthy output counts are summed: null and 0 ask no length), and Python's csv and json
modules (strict quoting; a JSON string may hold U+2028).
"""

from __future__ import annotations

import json

import pytest

from inferlab.bench.datasets import load_file
from inferlab.bench.tags import request_tag
from inferlab.bench.templates import BodyOptions, make_template
from inferlab.bench.tokens import TokenCounter
from inferlab.cli import main
from inferlab.errors import InferlabError

TAG = request_tag("123456", 0, 1)


def prompts_of(tmp_path, name: str, content: str | bytes, default: int = 8):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, newline="")
    return load_file(str(path), TokenCounter(None), default)


def body(prompt, chat: bool = False) -> dict:
    return json.loads(make_template(prompt, BodyOptions("m", chat, None)).body(TAG))


# --- 1. prefix columns: guidellm's system prompt

def test_a_prefix_column_goes_before_the_text_or_as_the_system_message(tmp_path):
    (row,) = prompts_of(tmp_path, "s.csv", "System_Prompt,prompt,output_tokens_count\n"
                                           "You are a pirate.,Say hi,4\n")
    # guidellm's completions: " ".join([prefix, text])
    assert body(row)["prompt"] == "You are a pirate. Say hi"
    assert body(row, chat=True)["messages"] == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Say hi"}]
    assert (body(row)["max_tokens"], body(row)["ignore_eos"]) == (4, True)


def test_prefixes_of_json_rows_and_of_chat_records(tmp_path):
    rows = [{"prefix": "Context: cats.", "question": "What?"},
            {"system": None, "prompt": "no prefix"},  # a null prefix is none
            {"system_prompt": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}]
    first, second, third = prompts_of(tmp_path, "p.jsonl",
                                      "\n".join(json.dumps(r) for r in rows))
    assert body(first)["prompt"] == "Context: cats. What?"
    assert body(second)["prompt"] == "no prefix"
    assert body(second, chat=True)["messages"] == [{"role": "user", "content": "no prefix"}]
    assert body(third, chat=True)["messages"] == [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}]
    assert body(third)["prompt"] == "Be brief. Hi"
    with pytest.raises(InferlabError, match=r"^b\.jsonl:1: system must be a string$"):
        prompts_of(tmp_path, "b.jsonl", '{"system": 3, "prompt": "x"}\n')


def test_the_prefix_counts_in_the_prompt_length(tmp_path, tokenizer_json):
    path = tmp_path / "s.jsonl"
    path.write_text('{"system_prompt": "the river", "prompt": "the stone"}\n')
    counter = TokenCounter(tokenizer_json)
    (row,) = load_file(str(path), counter, 8)
    assert row.prompt_tokens == len(counter.encode("the river the stone"))


# --- 5. a quote left open is an error, not the rest of the file in one cell

def test_an_unterminated_csv_quote_is_a_one_line_error(tmp_path, capsys, mock_server):
    text = 'prompt,output_tokens_count\nok,2\n"unterminated,5\nbar,2\nbaz,3\n'
    with pytest.raises(InferlabError, match=r"^u\.csv:3: not CSV \(unexpected end of data\)$"):
        prompts_of(tmp_path, "u.csv", text)
    # a quote inside an unquoted cell's text is no CSV either (csv's strict mode)
    with pytest.raises(InferlabError, match=r"^q\.csv:2: not CSV"):
        prompts_of(tmp_path, "q.csv", 'prompt\n"a"b\n')
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous",
            "--max-requests", "1", "--data", str(tmp_path / "u.csv"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: u.csv:3: not CSV (unexpected end of data)\n"


def test_quoted_cells_still_hold_newlines_and_commas(tmp_path):
    rows = prompts_of(tmp_path, "m.csv", 'prompt,n\n\n"one\ntwo, three",1\nlast,2\n')
    assert [r.text for r in rows] == ["one\ntwo, three", "last"]
    with pytest.raises(InferlabError, match=r"^e\.csv:4: output_tokens_count must be"):
        prompts_of(tmp_path, "e.csv", 'prompt,output_tokens_count\n"a\nb",1\nc,-1\n')


# --- 6. null and 0 counts ask no length; 5.0 is 5

@pytest.mark.parametrize("name, content", [
    ("n.jsonl", '{"prompt": "x", "output_tokens_count": null}\n'),
    ("z.jsonl", '{"prompt": "x", "output_tokens_count": 0}\n'),
    ("n.json", '[{"prompt": "x", "completion_tokens_count": null}]'),
    ("z.csv", "prompt,output_tokens_count\nx,0\n"),
    ("e.csv", "prompt,output_tokens_count\nx,\n"),
])
def test_a_null_or_zero_count_asks_no_length(tmp_path, name, content):
    (row,) = prompts_of(tmp_path, name, content, default=9)
    assert (row.output_tokens, row.exact_output) == (9, False)
    assert "ignore_eos" not in body(row)


def test_integral_floats_are_counts_and_fractions_are_refused(tmp_path):
    (csv_row,) = prompts_of(tmp_path, "f.csv", "prompt,output_tokens_count\nfoo,5.0\n")
    (json_row,) = prompts_of(tmp_path, "f.jsonl", '{"prompt": "x", "output_tokens_count": 4.0}')
    assert (csv_row.output_tokens, csv_row.exact_output) == (5, True)
    assert (json_row.output_tokens, json_row.exact_output) == (4, True)
    for name, content in [("h.csv", "prompt,output_tokens_count\nfoo,5.5\n"),
                          ("h.jsonl", '{"prompt": "x", "output_tokens_count": 2.5}'),
                          ("w.csv", "prompt,output_tokens_count\nfoo,five\n"),
                          ("m.jsonl", '{"prompt": "x", "max_tokens": 0}')]:
        with pytest.raises(InferlabError, match=r":[12]: \w+ must be a positive int"):
            prompts_of(tmp_path, name, content)


def test_a_null_count_falls_back_to_the_max_tokens_ceiling(tmp_path):
    (row,) = prompts_of(tmp_path, "c.jsonl",
                        '{"prompt": "x", "output_tokens_count": null, "max_tokens": 7}')
    assert (row.output_tokens, row.exact_output) == (7, False)


# --- 7. only "\n" ends a line

def test_unicode_line_breaks_stay_inside_a_line(tmp_path):
    (row,) = prompts_of(tmp_path, "u.jsonl",
                        '{"prompt": "a\u2028b", "output_tokens_count": 2}\n')
    assert row.text == "a\u2028b"  # JSON strings may hold U+2028 unescaped
    (line,) = prompts_of(tmp_path, "u.txt", "before\u2028after form\x0cfeed\x85end\n")
    assert line.text == "before\u2028after form\x0cfeed\x85end"
    rows = prompts_of(tmp_path, "c.txt", "line one\r\n\r\n  \r\nline two  \r\n")
    assert [r.text for r in rows] == ["line one", "line two  "]


# --- 9. several matching columns: the first in the file's column order

def test_the_first_matching_column_of_the_file_wins(tmp_path):
    # guidellm maps SQuAD's `context` (the third column), not its `question`
    (row,) = prompts_of(tmp_path, "sq.csv", "id,title,context,question\n1,T,The text,Why?\n")
    assert row.text == "The text"
    (row,) = prompts_of(tmp_path, "q.csv", "question,prompt\nWhy?,Say\n")
    assert row.text == "Why?"
    # count columns: the first one, even where a later one holds a count
    (row,) = prompts_of(tmp_path, "c.csv", "prompt,completion_tokens_count,output_tokens_count"
                                           "\nx,3,5\n")
    assert (row.output_tokens, row.exact_output) == (3, True)
    (row,) = prompts_of(tmp_path, "p.csv", "prefix,system,prompt\nA,B,x\n")
    assert body(row)["prompt"] == "A x"


def test_json_rows_take_the_columns_in_the_order_they_first_appear(tmp_path):
    # a dataset's columns are those of its first rows: `question` comes before `prompt`
    lines = ['{"question": "Q1", "prompt": "P1"}', '{"prompt": "P2", "question": "Q2"}']
    first, second = prompts_of(tmp_path, "o.jsonl", "\n".join(lines))
    assert (first.text, second.text) == ("Q1", "Q2")


# --- 10. a byte order mark

@pytest.mark.parametrize("name, content, text", [
    ("b.txt", "bom first line\nsecond\n", "bom first line"),
    ("b.json", '[{"prompt": "x"}]', "x"),
    ("b.jsonl", '{"prompt": "x"}\n', "x"),
    ("b.csv", "prompt\nx\n", "x"),
])
def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path, name, content, text):
    rows = prompts_of(tmp_path, name, b"\xef\xbb\xbf" + content.encode())
    assert rows[0].text == text


# --- 11. deep nesting

@pytest.mark.parametrize("name, content, where", [
    ("d.json", "[" * 100_000 + "]" * 100_000, "d.json"),
    ("d.jsonl", '{"prompt": "x"}\n{"a": ' + "[" * 50_000 + "]" * 50_000 + "}\n", "d.jsonl:2"),
])
def test_deeply_nested_json_is_a_one_line_error(tmp_path, capsys, mock_server, name, content,
                                                where):
    (tmp_path / name).write_text(content)
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous",
            "--max-requests", "1", "--data", str(tmp_path / name), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {where}: not valid JSON (nested too deeply)\n"


# --- minor: suffixes in any case

def test_suffixes_are_read_in_any_case(tmp_path):
    assert [r.text for r in prompts_of(tmp_path, "UPPER.CSV", "prompt\nx\n")] == ["x"]
    assert [r.text for r in prompts_of(tmp_path, "rows.JSONL", '{"prompt": "y"}')] == ["y"]
    assert [r.text for r in prompts_of(tmp_path, "lines.Txt", "z\n")] == ["z"]

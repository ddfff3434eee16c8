"""The tool parsers on hand-written replies: the calls and content each must give, whole and fed
in pieces (every split in two, and a character at a time), which must agree."""

from __future__ import annotations

import json

import pytest

from inferlab.server.tool_parsers import (
    HermesCalls,
    Llama3JsonCalls,
    MistralCalls,
    NamedCall,
    ParsedDelta,
    RequiredCalls,
    ToolParser,
)


def read(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, dict]], list[ParsedDelta]]:
    """(content, [(name, arguments)], what each piece gave) of a reply fed in pieces."""
    outs = [parser.feed(p) for p in pieces] + [parser.finish()]
    content = "".join(o.content for o in outs)
    names: list[str] = []
    arguments: list[str] = []
    for call in (c for o in outs for c in o.calls):
        if call.name is not None:
            assert call.index == len(names)  # calls are numbered in order, each named once
            names.append(call.name)
            arguments.append("")
        arguments[call.index] += call.arguments
    return content, [(n, json.loads(a)) for n, a in zip(names, arguments, strict=True)], outs


def splits(text: str) -> list[list[str]]:
    return [[text]] + [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


CASES = [
    # (parser, reply, content, calls)
    (lambda: NamedCall("get_weather"), '{"city": "Paris", "unit": "celsius"}', "",
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    (RequiredCalls, '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                    '{"parameters": {"q": "a}b\\"]"}, "name": "search"}]', "",
     [("get_weather", {"city": "Paris"}), ("search", {"q": 'a}b"]'})]),
    (RequiredCalls, '[{"name": "f", "parameters": {}}, {"name": "g", "par',
     ', {"name": "g", "par', [("f", {})]),  # cut short by max_tokens
    (HermesCalls, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
                  '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "search", "arguments": {}}\n'
                  '</tool_call>\n', "Let me check.\n",
     [("get_weather", {"city": "Paris"}), ("search", {})]),
    (HermesCalls, '<tool_call>\n{"name": oops}\n</tool_call> then a < b <tool_',
     '<tool_call>\n{"name": oops}\n</tool_call> then a < b <tool_', []),
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {"x": [1, "</tool"]}}\n',
     "", [("f", {"x": [1, "</tool"]})]),  # left open at the end: read as if closed
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n\nDone.', "\n\nDone.",
     [("f", {})]),
    (Llama3JsonCalls, '{"name": "f", "parameters": {"x": "};"}}; {"name": "g", "arguments": {}}\n',
     "", [("f", {"x": "};"}), ("g", {})]),
    (Llama3JsonCalls, '<|python_tag|>{"name": "f", "parameters": {"n": 1}}', "", [("f", {"n": 1})]),
    (Llama3JsonCalls, 'Sure: {"name": "f", "parameters": {}}', 'Sure: {"name": "f", "parameters": {}}', []),
    (Llama3JsonCalls, '{"name": "f"} {"name": "g", "parameters": {}} and {"name": "h", "param',
     '{"name": "f"} and {"name": "h", "param', [("g", {})]),
    (Llama3JsonCalls, "<|python", "<|python", []),
    (MistralCalls, 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"q": "[x]"}}, {"name": "g", '
                   '"arguments": {}}] Done', "Sure.  Done", [("f", {"q": "[x]"}), ("g", {})]),
    (MistralCalls, "No call [TOOL_", "No call [TOOL_", []),
    (MistralCalls, '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name"', ', {"name"', [("f", {})]),
]


@pytest.mark.parametrize(("make", "reply", "content", "calls"), CASES)
def test_replies_give_the_hand_read_calls_however_they_are_split(make, reply, content, calls):
    for pieces in splits(reply):
        got_content, got_calls, _ = read(make(), pieces)
        assert (got_content, got_calls) == (content, calls), pieces


def test_a_named_call_streams_its_arguments_as_they_come():
    parser = NamedCall("f")
    first, second = parser.feed('{"a"'), parser.feed(": 1}")
    assert [(c.index, c.name, c.arguments) for c in first.calls + second.calls] == [
        (0, "f", '{"a"'), (0, None, ": 1}")]
    assert not parser.finish()
    empty = NamedCall("f")  # max_tokens reached before any text: still the named call
    assert [(c.name, c.arguments) for c in empty.finish().calls] == [("f", "")]


def test_a_required_call_goes_out_when_its_object_closes():
    parser = RequiredCalls()
    assert not parser.feed('[{"name": "f", "parameters": {"x": 1}')
    out = parser.feed('}, {"name"')
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("f", {"x": 1})]
    assert not out.content


def test_hermes_content_goes_out_before_the_call_is_whole():
    parser = HermesCalls()
    assert parser.feed("It is <to").content == "It is "  # "<to" may open a call: held
    assert parser.feed("day>").content == "<today>"
    assert parser.feed("\n<tool_call>{").content == "\n"
    assert parser.num_calls == 0


@pytest.mark.parametrize("make", [RequiredCalls, HermesCalls, Llama3JsonCalls, MistralCalls])
def test_finish_reason_counts_calls_the_model_chose(make):
    assert make.reports_calls and not NamedCall.reports_calls

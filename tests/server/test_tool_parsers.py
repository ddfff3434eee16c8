"""The tool parsers on hand-written replies: the calls and content each must give, whole and fed
in pieces (every split in two, and a character at a time), which must agree."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inferlab.server.tool_call_formats import HermesCalls, Llama3JsonCalls, MistralCalls
from inferlab.server.tool_parsers import NamedCall, ParsedDelta, RequiredCalls, ToolParser


def read(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, Any]], list[ParsedDelta]]:
    """(content, [(name, arguments: read as JSON, or the text of arguments cut short)], what each
    piece gave) of a reply fed in pieces."""
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
    return content, [(n, as_json(a)) for n, a in zip(names, arguments, strict=True)], outs


def as_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def splits(text: str) -> list[list[str]]:
    return [[text]] + [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


CASES = [
    # (parser, reply, content, calls)
    (lambda: NamedCall("get_weather"), '{"city": "Paris", "unit": "celsius"}', "",
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    (RequiredCalls, '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                    '{"parameters": {"q": "a}b\\"]"}, "name": "search"}]', "",
     [("get_weather", {"city": "Paris"}), ("search", {"q": 'a}b"]'})]),
    (RequiredCalls, '[{"name": "f", "parameters": {}}, {"name": "g", "par', "",
     [("f", {}), ("g", "")]),  # cut short by max_tokens: a stream sends whatever came of a call
    # (a whole reply has none of them: test_a_whole_required_reply_cut_short_has_no_calls)
    (RequiredCalls, '[ {"name" : "f" ,"parameters":\n {"q": ["}"]} } ,{"parameters": {"q": "ab',
     "", [("f", {"q": ["}"]})]),  # the second call's name never came: the guide's framing
    (RequiredCalls, '[\n    {"name": "f", "parameters": {"cit', "", [("f", '{"cit')]),  # no "[" as content
    (RequiredCalls, "[\n    {", "", []),
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
    (MistralCalls, '[TOOL_CALLS][{"na\\qme": "f"}, {"a b": 1, "name": "g", "arguments": {}}] ok',
     '[TOOL_CALLS][{"na\\qme": "f"}] ok', [("g", {})]),  # a key JSON cannot read; the text kept whole
    (Llama3JsonCalls, '{"a\nb": 1, "name": "f", "parameters": {}}', "",
     [("f", {})]),  # a raw line break in a key: not JSON, but a call once named with arguments
    (RequiredCalls, '[{"name": {"x": 1}, "parameters": {}}]', '[{"name": {"x": 1}, "parameters": {}}]', []),
    (MistralCalls, '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name"', ', {"name"', [("f", {})]),
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {"a": 1}, "arguments": {"b": 2}, "name": "g"}'
                  '</tool_call>', "", [("f", {"a": 1})]),  # a key's first value counts, as it went out
    (HermesCalls, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_', "", [("f", {})]),  # cut in the tag
    (HermesCalls, '<tool_call>\n{"name": oops}\n</tool', '<tool_call>\n{"name": oops}\n</tool', []),
    (MistralCalls, '[TOOL_CALLS] [{"name": "f", "arguments": {"q', "", [("f", '{"q')]),
    (HermesCalls, '<tool_call>\n{"name": "f", "arguments": {}} oops\n</tool_call>', "\n oops\n",
     [("f", {})]),  # the text beside a block's call is content
    (Llama3JsonCalls, '{"arguments": {"q": "x"}, "parameters": [], "name": "f"}', "",
     [("f", {"q": "x"})]),  # the arguments key that came first
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {"q": "</tool_call>"}}</tool_call> ok',
     " ok", [("f", {"q": "</tool_call>"})]),  # a closing tag inside a string closes nothing
    (HermesCalls, '<tool_call>he said "hi</tool_call> ok', '<tool_call>he said "hi</tool_call> ok',
     []),  # a quote outside any object opens no string
    # after the array, objects are content, not calls written twice
    (MistralCalls, '[TOOL_CALLS][{"name": "f", "arguments": {}}] then [{"name": "g", "arguments": {}}]',
     ' then [{"name": "g", "arguments": {}}]', [("f", {})]),
    (MistralCalls, 'Text [TOOL_CALLS] [1, 2, 3]', "Text [TOOL_CALLS] [1, 2, 3]", []),  # no call: all of it
    (MistralCalls, '[TOOL_CALLS] [garbage', "[TOOL_CALLS] [garbage", []),  # cut short, no call
    # v11 on: each call as [TOOL_CALLS]name[ARGS]{...}; v13 with [CALL_ID]id
    (MistralCalls, 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Sure.",
     [("get_weather", {"city": "Paris"})]),
    (MistralCalls, '[TOOL_CALLS]f[ARGS]{"q": "}{"}\n[TOOL_CALLS]g.v2[ARGS]{}\n', "",
     [("f", {"q": "}{"}), ("g.v2", {})]),  # the blank text between and after calls is no content
    (MistralCalls, '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"x": [1]} Done.', " Done.", [("f", {"x": [1]})]),
    (MistralCalls, '[TOOL_CALLS]f{"x": 1}', "", [("f", {"x": 1})]),  # [ARGS] decoded away
    (MistralCalls, '[TOOL_CALLS]I cannot {call} it', "[TOOL_CALLS]I cannot {call} it", []),  # no name: text
    (MistralCalls, '[TOOL_CALLS] garbage', "[TOOL_CALLS] garbage", []),  # no call: the tag kept
    (MistralCalls, 'Hi [TOOL_CALLS]', "Hi [TOOL_CALLS]", []),
    (MistralCalls, '[TOOL_CALLS]f[ARGS]{"q": "ab', "", [("f", '{"q": "ab')]),  # cut short
    (MistralCalls, 'Hi [TOOL_CALLS]get_wea', "Hi [TOOL_CALLS]get_wea", []),  # cut in the name: text
    (MistralCalls, '[TOOL_CALLS]f[ARGS]{} then [TOOL_CALLS][{"name": "g", "arguments": {}}]',
     ' then [TOOL_CALLS][{"name": "g", "arguments": {}}]', [("f", {})]),  # no array after a named call
    (MistralCalls, '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"x": 1}] end [{"name": "h", '
                   '"arguments": {}}]', ', {"x": 1}] end [{"name": "h", "arguments": {}}]', [("f", {})]),
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


def test_a_required_call_goes_out_once_named_and_then_its_arguments_as_they_come():
    parser = RequiredCalls()
    pieces = ['[{"na', 'me": "f", "param', 'eters": {"x"', ': "a\\"}"', "} ", '}, {"parameters": {"y": 2}',
              ', "name": "g"}]']
    assert [[(c.index, c.name, c.arguments) for c in parser.feed(p).calls] for p in pieces] == [
        [], [(0, "f", "")], [(0, None, '{"x"')], [(0, None, ': "a\\"}"')], [(0, None, "}")], [],
        [(1, "g", '{"y": 2}')]]
    assert not parser.finish()
    other = RequiredCalls()  # a number before the name (outside the guide's schema) is passed over
    assert [(c.name, c.arguments) for c in other.feed('[{"id": 7, "name": "f"').calls] == [("f", "")]


@pytest.mark.parametrize(("make", "opening"), [
    (HermesCalls, "Sure.\n<tool_call>\n"), (Llama3JsonCalls, "<|python_tag|>"), (MistralCalls, "[TOOL_CALLS] [")])
def test_an_unguided_call_goes_out_once_named_with_arguments_and_then_as_they_come(make, opening):
    parser = make()
    pieces = [opening, '{"name": "get_weather"', ', "arguments": {"city"', ': "Par', 'is"}', "}"]
    got = [[(c.index, c.name, c.arguments) for c in parser.feed(p).calls] for p in pieces]
    assert got == [[], [], [(0, "get_weather", '{"city"')], [(0, None, ': "Par')], [(0, None, 'is"}')], []]
    named_only = make()  # a name alone may be an object that is no call: held until it closes
    assert not named_only.feed(opening + '{"name": "f", "x": 1').calls


def test_hermes_content_goes_out_before_the_call_is_whole():
    parser = HermesCalls()
    assert parser.feed("It is <to").content == "It is "  # "<to" may open a call: held
    assert parser.feed("day>").content == "<today>"
    assert parser.feed("\n<tool_call>{").content == "\n"
    assert parser.num_calls == 0


@pytest.mark.parametrize("make", [RequiredCalls, HermesCalls, Llama3JsonCalls, MistralCalls])
def test_finish_reason_counts_calls_the_model_chose(make):
    assert make.reports_calls and not NamedCall.reports_calls


PARSERS = [lambda: NamedCall("f"), RequiredCalls, HermesCalls, Llama3JsonCalls, MistralCalls]
PIECES = ['{"name": "f", ', '"arguments": {"x": 1}', '"parameters": {}', "}", "{", "[", "]", ",", '"',
          "\\", "\\q", "\n", " ", ";", "a", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "f",
          "<|python_tag|>", '"na', 'me"', ": ", "1", '"k\\q": 2, ', '"a\nb": 3, ']


@settings(max_examples=1000, deadline=None)
@example(1, ['{"name": "f", ', '{"name": "f", ', "]", '"arguments": {"x": 1}'], random.Random(0))  # "]" ends
@given(st.sampled_from(range(len(PARSERS))), st.lists(st.sampled_from(PIECES), max_size=14),
       st.randoms())
def test_any_reply_reads_the_same_whole_and_in_pieces_without_raising(which, parts, rng):
    """Model text of any shape (unguided replies are): no parser raises, and the reading does
    not depend on how the text was split."""
    text = "".join(parts)
    cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole, split = read_raw(PARSERS[which](), [text]), read_raw(PARSERS[which](), pieces)
    assert whole == split, pieces


def read_raw(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments text)]) of a reply fed in pieces."""
    outs = [parser.feed(p) for p in pieces] + [parser.finish()]
    calls: list[list[str]] = []
    for call in (c for o in outs for c in o.calls):
        if call.name is not None:
            calls.append([call.name, ""])
        calls[call.index][1] += call.arguments
    return "".join(o.content for o in outs), [(n, a) for n, a in calls]


@pytest.mark.parametrize(("make", "reply", "unreadable"), [
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {"city": "Pa', True),  # cut by max_tokens
    (HermesCalls, '<tool_call>{"name": "f", "arguments": {"city": "Paris"}}</tool_call>', False),
    (HermesCalls, 'Sunny.', False),
    (Llama3JsonCalls, '{"name": "f", "parameters": {"x": [1, ', True),
    (MistralCalls, '[TOOL_CALLS]f[ARGS]{"q": "ab', True),
    (lambda: NamedCall("f"), '{"city": "Pa', False),  # forced: the guide's JSON, cut or not
])
def test_a_whole_reply_whose_call_cannot_be_read_is_its_text(make, reply, unreadable):
    """vLLM's parsers json.loads each call of a whole reply and give a reply they cannot read
    back as content with no calls; a stream has sent the pieces as they came."""
    from inferlab.server.reply import ReplyReader

    reader = ReplyReader(make(), None)
    _, parsed = reader.read(reply, finished=True)
    assert reader.calls_unreadable() is unreadable
    if unreadable:
        assert parsed.calls and reader.drop_calls() == reply
        assert (reader.calls, reader.finish_reason("length")) == ([], "length")


@pytest.mark.parametrize(("reply", "calls", "finish"), [
    ('[{"name": "f", "parameters": {}}, {"name": "g", "parameters": ', [], "length"),
    ('[{"name": "f", "parameters": {"q": [1]}}, {"name": "g", "parameters": {}}', [], "length"),
    ('[{"name": "f", "parameters": {"q": [1]}}, {"name": "g", "parameters": {}}]',
     [("f", '{"q": [1]}'), ("g", "{}")], "tool_calls"),
])
def test_a_whole_required_reply_cut_short_has_no_calls(reply, calls, finish):
    """vLLM validates a required reply's array whole (TypeAdapter(list[FunctionDefinition])) and
    gives one that never closed no calls and empty content, even its complete calls: a call
    whose arguments are no JSON (once '') never reaches a client that json.loads them."""
    from inferlab.server.reply import ReplyReader

    reader = ReplyReader(RequiredCalls(), None)
    _, parsed = reader.read(reply, finished=True)
    content = reader.drop_calls() if reader.calls_unreadable() else parsed.content
    assert content == ""
    assert [(c.function.name, c.function.arguments) for c in reader.calls] == calls
    assert reader.finish_reason("stop" if calls else "length") == finish

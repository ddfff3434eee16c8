"""The whitespace a guide lets through between `</think>` and the answer (thinking_grammar's gap)
is not the answer: with a guide, `content` (and a forced call's arguments) is exactly what the
guide matched, whole and streamed alike, as vLLM's guide (which takes every token after
`</think>`) gives it; without one, what follows `</think>` is kept whole, as vLLM's parsers keep
it. The references: replies read by hand, and Python's re on the inner pattern."""

from __future__ import annotations

import json
import random
import re

import pytest
from server_helpers import MODEL_NAME
from test_reasoning_parsers import read
from test_server_reasoning import parser_client, reply
from test_tool_parsers import splits

from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.thinking_grammar import AfterThinking
from inferlab.server.reasoning import Qwen3Reasoning, ReasoningParser


@pytest.mark.parametrize(("make", "reply_text", "reasoning", "content"), [
    (ReasoningParser, "cat</think>\n\nno", "cat", "no"),
    (ReasoningParser, "cat</think> \t\r\nno", "cat", "no"),  # the gap's four characters
    (ReasoningParser, "cat</think>\n\n\n\n\n5", "cat", "\n5"),  # the fifth is the guide's own
    (ReasoningParser, "cat</think>\n", "cat", ""),  # cut short in the gap
    (ReasoningParser, "cat</think>no \n", "cat", "no \n"),  # whitespace after the answer stays
    (Qwen3Reasoning, "<think>cat</think>\n\nyes", "cat", "yes"),
    (Qwen3Reasoning, '<think></think>\n{"a": 1}', "", '{"a": 1}'),
    (Qwen3Reasoning, "\n\nyes", "", "\n\nyes"),  # no thinking: the guide held it from the start
])
def test_a_guided_parser_drops_the_gap_however_it_is_fed(make, reply_text, reasoning, content):
    for pieces in splits(reply_text):
        assert read(make(guided=True), pieces) == (reasoning, content), pieces


def test_an_unguided_parser_keeps_what_follows_the_thinking():
    """vLLM's parsers give all after `</think>` as content; Qwen3 and R1 write "\\n\\n" there."""
    for pieces in splits("<think>cat</think>\n\nyes"):
        assert read(Qwen3Reasoning(), pieces) == ("cat", "\n\nyes"), pieces


@pytest.mark.parametrize("pattern", ["yes|no", "[0-9]+", r"\s*[0-9]+", " [0-9]"])
@pytest.mark.parametrize("make", [ReasoningParser, Qwen3Reasoning])
def test_guided_content_is_what_the_inner_pattern_matches(make, pattern):
    """Replies the guide takes whole (random thinking, a random whitespace run after `</think>`,
    then an answer): the guided parser's content matches the inner pattern by Python's re, and
    its reasoning is the text between the markers."""
    opener, closer = make.guide_markers
    guide = AfterThinking(RegexGrammar(pattern), closer, opener)
    rng = random.Random(0)
    checked = 0
    for _ in range(600):
        thinking = "".join(rng.choice("ab <>/\n") for _ in range(rng.randint(0, 6)))
        run = "".join(rng.choice(" \t\n") for _ in range(rng.randint(0, 7)))
        answer = rng.choice(["yes", "no", "42", "7", " 7", "\n\n3"])
        text = (opener or "") + thinking + closer + run + answer
        state = guide.advance(guide.start, text)
        if closer in thinking or state is None or not guide.is_complete(state):
            continue
        checked += 1
        for pieces in [[text], list(text)]:
            got_reasoning, content = read(make(guided=True), pieces)
            assert got_reasoning == thinking and re.fullmatch(pattern, content), (text, content)
    assert checked >= 10  # the premise: the guide took enough of them


# a prefill that thinks "cat" then answers, so the model goes on in the pattern: "</think>\n\n"
PATTERN = [{"role": "user", "content": "Repeat the pattern."},
           {"role": "assistant", "content": "<think>cat</think>\n\nyes\n" * 5}]
CONTINUED = {"add_generation_prompt": False, "continue_final_message": True}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def qwen3_client(engine):
    yield from parser_client(engine, "qwen3")


@pytest.mark.parametrize(("guide", "matches"), [
    ({"guided_choice": ["yes", "no"]}, lambda content: content in ("yes", "no")),
    ({"guided_regex": "yes|no"}, lambda content: re.fullmatch("yes|no", content)),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
     lambda content: re.fullmatch(r'\{"a":-?[0-9]+\}', content)),
])
def test_guided_content_is_exactly_what_the_guide_matched(client, qwen3_client, guide, matches):
    plain = reply(client, messages=PATTERN, extra_body=CONTINUED)[1]
    assert plain.startswith("<think>cat</think>\n\n")  # the premise: the model writes a gap
    body = {"messages": PATTERN, "extra_body": {**CONTINUED, **guide}}
    reasoning, content = reply(qwen3_client, **body)
    assert reasoning == "cat" and matches(content), content
    assert reply(qwen3_client, stream=True, **body) == (reasoning, content)


def test_a_forced_call_and_the_logprobs(qwen3_client):
    """A forced call's arguments are the guide's JSON alone; the logprobs, one per token of the
    whole reply as vLLM's are (the thinking's too), still hold the gap's tokens."""
    tool = {"type": "function", "function": {"name": "add", "parameters": SCHEMA}}
    choice = qwen3_client.chat.completions.create(
        model=MODEL_NAME, messages=PATTERN, temperature=0.0, max_tokens=20, logprobs=True,
        tools=[tool], tool_choice={"type": "function", "function": {"name": "add"}},
        extra_body=CONTINUED).choices[0]
    arguments = choice.message.tool_calls[0].function.arguments
    assert arguments[0] == "{" and isinstance(json.loads(arguments)["a"], int), arguments
    spelled = "".join(entry.token for entry in choice.logprobs.content)
    assert spelled.startswith("<think>cat</think>\n") and arguments in spelled

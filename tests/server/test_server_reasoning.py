"""--reasoning-parser through the `openai` client: the thinking comes back as
reasoning (and reasoning_content), the answer as content, whole and streamed alike. The reference is the same
request to a server without a parser (greedy, one engine), its text split at `</think>` by hand."""

from __future__ import annotations

import json

import openai
import pytest
from server_helpers import API_KEY, MODEL_NAME, start_server

GREEDY = {"temperature": 0.0, "max_tokens": 40}
# a reply continued from a prefill that thinks in a pattern, so the model closes its thinking
PATTERN = [{"role": "user", "content": "Count with me."}, {"role": "assistant", "content": (
    "<think>\nI think it is 1.\n</think>\nIt is 1.\n<think>\nI think it is 2.\n</think>\nIt is 2."
    "\n<think>\nI think it is 3")}]
CONTINUED = {"messages": PATTERN,
             "extra_body": {"add_generation_prompt": False, "continue_final_message": True}}


def parser_client(engine, parser: str):
    for server in start_server(engine, api_key=API_KEY, reasoning_parser=parser):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def r1_client(engine):
    yield from parser_client(engine, "deepseek_r1")


@pytest.fixture(scope="module")
def qwen3_client(engine):
    yield from parser_client(engine, "qwen3")


def reply(client, stream: bool = False, **body) -> tuple[str | None, str | None]:
    """(reasoning, content) of one greedy chat reply, put together if streamed; the thinking
    comes under vLLM's name `reasoning` and alike under its older one, `reasoning_content`."""
    if not stream:
        message = client.chat.completions.create(model=MODEL_NAME, **GREEDY, **body).choices[0].message
        parts = {key: getattr(message, key, None) for key in ("reasoning", "reasoning_content")}
        parts["content"] = message.content
    else:
        parts = {}
        for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **GREEDY, **body):
            for choice in chunk.choices:
                for key in ("reasoning", "reasoning_content", "content"):
                    piece = getattr(choice.delta, key, None)
                    if piece:
                        parts[key] = parts.get(key, "") + piece
    assert parts.get("reasoning") == parts.get("reasoning_content")
    return parts.get("reasoning"), parts.get("content")


def test_deepseek_r1_splits_at_the_end_of_thinking(client, r1_client):
    plain = reply(client, **CONTINUED)[1]
    thinking, closed, answer = plain.partition("</think>")
    assert closed and thinking and answer  # the premise: the model closed its thinking
    expected = (thinking, answer)
    assert reply(r1_client, **CONTINUED) == expected
    assert reply(r1_client, stream=True, **CONTINUED) == expected
    hidden = {"messages": PATTERN, "extra_body": {**CONTINUED["extra_body"], "include_reasoning": False}}
    assert reply(r1_client, **hidden) == (None, answer)
    # a reply that never closes its thinking is all thinking, as R1's prompt opened it
    messages = [{"role": "user", "content": "Say hi."}]
    free = reply(client, messages=messages)[1]
    assert "</think>" not in free and reply(r1_client, messages=messages) == (free, None)
    # left out, all thinking is no content at all, as vLLM gives it (once "")
    assert reply(r1_client, messages=messages, extra_body={"include_reasoning": False}) == (None, None)


def test_qwen3_thinks_only_in_a_reply_that_opens_with_think(client, qwen3_client):
    messages = [{"role": "user", "content": "Say hi."}]
    assert reply(qwen3_client, messages=messages) == (None, reply(client, messages=messages)[1])
    plain = reply(client, **CONTINUED)[1]  # does not open with <think>: all content
    assert reply(qwen3_client, **CONTINUED) == (None, plain)


def test_deepseek_r1_guides_hold_the_answer_only(client, r1_client):
    """A guide starts after `</think>`, as vLLM's does: the same thinking as the unguided
    reply, then exactly an answer the guide allows (the whitespace gap the thinking grammar lets
    the model write after `</think>` is not part of the content)."""
    thinking = reply(client, **CONTINUED)[1].partition("</think>")[0]
    choices = ["It is 3.", "It is three."]
    reasoning, content = reply(r1_client, **{**CONTINUED, "extra_body": {
        **CONTINUED["extra_body"], "guided_choice": choices}})
    assert reasoning == thinking and content in choices
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    reasoning, content = reply(r1_client, **CONTINUED, response_format={
        "type": "json_schema", "json_schema": {"name": "count", "schema": schema}})
    assert reasoning == thinking and isinstance(json.loads(content)["n"], int)


def test_qwen3_guides_hold_the_answer_whether_the_reply_thinks_or_not(client, qwen3_client):
    """A reply that opens with <think> thinks freely, then the guide holds its answer; one that
    does not is held from its first character."""
    opens = [*PATTERN[:1], {"role": "assistant", "content": (
        "<think>\nI think it is 1.\n</think>\nIt is 1.\n<think>\nI think it is 2.\n</think>\n"
        "It is 2.\n")}]
    body = {"messages": opens, "extra_body": {**CONTINUED["extra_body"],
                                              "guided_choice": ["It is 3.", "It is three."]}}
    plain = reply(client, messages=opens, extra_body=CONTINUED["extra_body"])[1]
    assert plain.startswith("<think>") and "</think>" in plain  # the premise
    reasoning, content = reply(qwen3_client, **body)
    assert reasoning == plain.removeprefix("<think>").partition("</think>")[0]
    assert content in ("It is 3.", "It is three.")
    direct = reply(qwen3_client, messages=[{"role": "user", "content": "Is it 3?"}],
                   extra_body={"guided_choice": ["yes", "no"]})
    assert direct in ((None, "yes"), (None, "no"))


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_a_parser_whose_markers_the_model_spells_in_pieces_is_warned_of_at_start(engine, parser, caplog):
    """The embedded SmolLM2 has no token for <think> or </think>: it does not reason, and a
    guide could let it spell <think> out and think past a forced call; the server says so."""
    from inferlab.server.app import create_app
    from inferlab.server.settings import ServerSettings

    with caplog.at_level("WARNING", logger="inferlab.server"):
        create_app(engine, ServerSettings(served_model_name=MODEL_NAME))
        assert not caplog.messages
        create_app(engine, ServerSettings(served_model_name=MODEL_NAME, reasoning_parser=parser))
    (warning,) = caplog.messages
    assert warning.startswith(f"--reasoning-parser {parser}: the model's tokenizer has no single "
                              "token for <think> or </think>, so this model likely does not reason")

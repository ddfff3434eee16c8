"""Guided decoding through the official `openai` client: guided_choice, json_object, JSON
schemas, regexes and EBNF grammars, in each of the forms clients send them (OpenAI's
response_format, vLLM's structured_outputs and guided_* fields). References: Python's json and
re modules, the jsonschema library and lark's parser, not the grammars under test."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from lark import Lark
from lark.exceptions import LarkError
from server_helpers import MODEL_NAME, tokenize, wait_until

GREEDY = {"temperature": 0.0}
CITY = {"type": "object", "required": ["city", "country"], "properties": {
    "city": {"type": "string"}, "country": {"type": "string"},
    "population": {"type": "integer"}, "capital": {"type": "boolean"}}}
MESSAGES = [{"role": "user", "content": "Name a large city as JSON."}]


def test_json_object_answers_with_a_json_object(client):
    """OpenAI's response_format json_object (chat, streamed too) and vLLM's structured_outputs
    {"json_object": true} (completions): what ends by EOS is an object json.loads reads."""
    messages = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=60,
                                          response_format={"type": "json_object"}, **GREEDY)
    assert chat.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=60,
                                            response_format={"type": "json_object"}, stream=True,
                                            **GREEDY)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content
    completion = client.completions.create(
        model=MODEL_NAME, prompt="A JSON object with a name and an age:", max_tokens=60, **GREEDY,
        extra_body={"structured_outputs": {"json_object": True}})
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(completion.choices[0].text), dict)
    assert completion.choices[0].text.startswith("{")


def test_guided_choice_answers_with_one_of_the_choices(client):
    """vLLM's guided_choice, and its newer structured_outputs {"choice": [...]}, chat and completions."""
    choices = ["yes", "no", "it depends"]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=10,
        n=4, seed=11, temperature=1.2, extra_body={"guided_choice": choices})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in chat.choices)
    completion = client.completions.create(
        model=MODEL_NAME, prompt="The answer is", max_tokens=10, **GREEDY,
        extra_body={"structured_outputs": {"choice": choices}})
    assert completion.choices[0].text in choices


def test_guided_choice_writes_special_token_text_as_text(client):
    """A choice that holds a special token's text is written with ordinary tokens: the reply is
    the whole choice, not the choice without the special token, nor ended by it."""
    choices = ["a<|endoftext|>b", "<|im_end|>"]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Pick one."}], max_tokens=12,
        n=4, seed=3, temperature=1.2, extra_body={"guided_choice": choices})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in chat.choices)


def test_json_schema_answers_validate_in_every_form(client):
    """OpenAI's response_format json_schema (chat, and streamed: the same text), vLLM's
    structured_outputs {"json": schema} and guided_json (a schema's text), completions."""
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    whole = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=80,
                                           response_format=response_format, **GREEDY)
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), CITY)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=80,
                                            response_format=response_format, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        whole.choices[0].message.content
    for extra in ({"structured_outputs": {"json": CITY}}, {"guided_json": json.dumps(CITY)}):
        completion = client.completions.create(model=MODEL_NAME, prompt="A city as JSON:", max_tokens=80,
                                               n=2, seed=4, temperature=1.0, extra_body=extra)
        for choice in completion.choices:
            if choice.finish_reason == "stop":
                jsonschema.validate(json.loads(choice.text), CITY)
            assert choice.text.startswith("{")


def test_disable_any_whitespace_gives_compact_json(client):
    """vLLM's structured_outputs disable_any_whitespace: the schema's answer has no whitespace
    outside its strings; without it this prompt gets some."""
    def answer(options: dict) -> str:
        chat = client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=80, **GREEDY,
            extra_body={"structured_outputs": {"json": CITY, **options}})
        assert chat.choices[0].finish_reason == "stop"
        return chat.choices[0].message.content

    def spaced_out(text: str) -> bool:  # whitespace outside the strings
        return bool(re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)))

    spaced, tight = answer({}), answer({"disable_any_whitespace": True})
    assert spaced_out(spaced) and not spaced_out(tight)
    jsonschema.validate(json.loads(tight), CITY)
    with pytest.raises(openai.BadRequestError, match="disable_any_whitespace must be true or false"):
        answer({"disable_any_whitespace": "yes"})


def test_properties_come_in_each_schemas_own_order(client):
    """Two schemas that differ only in the order of their properties: each answer writes them in
    its own schema's order, whichever the server compiled first."""
    def keys(first: str, second: str) -> list[str]:
        schema = {"type": "object", "properties": {first: {"type": "integer"}, second: {"type": "integer"}},
                  "required": ["alpha", "beta"], "additionalProperties": False}
        out = client.completions.create(model=MODEL_NAME, prompt="JSON:", max_tokens=30, **GREEDY,
                                        extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}})
        return list(json.loads(out.choices[0].text))

    assert keys("beta", "alpha") == ["beta", "alpha"]
    assert keys("alpha", "beta") == ["alpha", "beta"]


SQL = '''
root ::= "SELECT " column " FROM " table (" WHERE " column " = " [0-9]+)? ";"
column ::= "name" | "age" | "city"
table ::= "users" | "orders"
'''
SQL_LARK = Lark('''root: "SELECT " column " FROM " table (" WHERE " column " = " /[0-9]/+)? ";"
column: "name" | "age" | "city"
table: "users" | "orders"''', start="root", parser="earley", lexer="dynamic")


def _parses(text: str) -> bool:
    try:
        SQL_LARK.parse(text)
    except LarkError:
        return False
    return True


REGEX = r"(Paris|Lyon), [A-Z][a-z]{2,8} \d{4}"


@pytest.mark.parametrize(("kind", "spec", "check", "question", "prompt"), [
    ("regex", REGEX, lambda text: re.fullmatch(REGEX, text), "Name a French city, a month and a year.",
     "Where and when?"),
    ("grammar", SQL, _parses, "Write an SQL query for the names of users aged 30.", "A query:"),
])
def test_guided_answers_are_whole(client, kind, spec, check, question, prompt):
    """vLLM's guided_<kind> (chat, streamed: the same text) and structured_outputs <kind>."""
    messages = [{"role": "user", "content": question}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=40,
                                           extra_body={f"guided_{kind}": spec}, **GREEDY)
    assert whole.choices[0].finish_reason == "stop"
    assert check(whole.choices[0].message.content), whole.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=40,
                                            extra_body={f"guided_{kind}": spec}, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        whole.choices[0].message.content
    completion = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, n=3, seed=2,
                                           temperature=1.0, extra_body={"structured_outputs": {kind: spec}})
    assert all(check(c.text) and c.finish_reason == "stop" for c in completion.choices), completion.choices


TAG = {"structures": [{"begin": "<city>", "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"]},
    "end": "</city>"}], "triggers": ["<"]}


def test_a_structural_tag_holds_each_tag_the_reply_opens(client, server):
    """vLLM's response_format structural_tag, and structured_outputs structural_tag (its JSON
    text): the same replies, each whole by the definition (engine.test_structural_tag), with "<"
    made likelier so that tags are written."""
    from engine.test_structural_tag import reference

    (less_than,) = tokenize(server, prompt="<", add_special_tokens=False)
    ask = {"model": MODEL_NAME, "n": 3, "seed": 1, "temperature": 1.0, "max_tokens": 60,
           "logit_bias": {str(less_than): 5}, "messages": [{"role": "user", "content": (
               'Which city is the capital of France? Answer like this: <city>{"name": "Rome"}</city>')}]}
    chat = client.chat.completions.create(**ask, response_format={"type": "structural_tag", **TAG})
    replies = [c.message.content for c in chat.choices]
    for choice, reply in zip(chat.choices, replies, strict=True):  # a cut reply: up to its last tag
        whole = reply if choice.finish_reason == "stop" else reply[:reply.rfind("</city>") + 7] \
            if "</city>" in reply else reply.split("<")[0]
        assert reference(TAG, whole), reply
    assert sum(c.finish_reason == "stop" and "</city>" in r for c, r in zip(chat.choices, replies, strict=True)) >= 2
    by_text = client.chat.completions.create(**ask, extra_body={"structured_outputs": {"structural_tag": json.dumps(TAG)}})
    assert [c.message.content for c in by_text.choices] == replies
    with pytest.raises(openai.BadRequestError, match="response_format: trigger '\\[' starts no"):
        client.chat.completions.create(**ask, response_format={"type": "structural_tag", **TAG, "triggers": ["<", "["]})
    with pytest.raises(openai.BadRequestError, match="give the structural tag once"):
        client.chat.completions.create(**ask, response_format={"type": "structural_tag", **TAG},
                                       extra_body={"structured_outputs": {"structural_tag": TAG}})


def test_a_grammar_too_ambiguous_to_follow_is_steered_or_fails_alone(client, server, monkeypatch,
                                                                    caplog):
    """Readings double with every "a" the bias forces: the guide stops offering "a" at its limit
    and the reply closes as a whole root. Where no way on stays within it (a limit of 1 reading
    here), the request gets a 400 (streamed: an error event after its first tokens, logged as
    the 200 it was), and the server serves the next one."""
    from inferlab.engine.guided import grammar

    (a,) = tokenize(server, prompt="a", add_special_tokens=False)
    forced = {"guided_grammar": 'root ::= "a" root "x" | "a" root "y" | "z"', "logit_bias": {str(a): 100}}
    steered = client.completions.create(model=MODEL_NAME, prompt="Go:", max_tokens=60, **GREEDY,
                                        extra_body=forced)
    assert re.fullmatch(r"(a+)z[xy]+", steered.choices[0].text)
    assert steered.choices[0].finish_reason == "stop"
    monkeypatch.setattr(grammar, "MAX_READINGS", 1)
    # "ab" goes out first, then "c" reads in two ways (a grammar no cache holds yet)
    stuck = {"guided_grammar": 'root ::= "ab" ("c" "d" | "c" "e")'}
    with pytest.raises(openai.BadRequestError, match="too ambiguous"):
        client.completions.create(model=MODEL_NAME, prompt="Go:", max_tokens=40, extra_body=stuck)
    with caplog.at_level("INFO", logger="inferlab.server.access"):
        with pytest.raises(openai.APIError, match="too ambiguous"):
            list(client.completions.create(model=MODEL_NAME, prompt=["Go:", "Go!"], max_tokens=40,
                                           stream=True, extra_body=stuck))

        def logged() -> list[str]:  # the line comes once the server has closed the stream
            return [m for m in caplog.messages if "POST /v1/completions" in m]

        assert wait_until(logged, 10)
    assert "status=200" in logged()[-1]  # not 499: the client did not go away
    monkeypatch.undo()
    after = client.completions.create(model=MODEL_NAME, prompt="Go:", max_tokens=3, **GREEDY)
    assert after.choices[0].finish_reason in ("stop", "length")

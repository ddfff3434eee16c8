"""Chat request fields against vLLM's and OpenAI's documented behaviour: fields that would change
the answer and are not implemented are refused by name; continuous usage stats count each
choice's own tokens, as vLLM's previous_num_tokens[i]; errors name the field the client sent;
an assistant's refusal parts are its text; a malformed response_format is refused; replies carry
OpenAI's system_fingerprint and message.refusal as vLLM's do, null."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import MODEL_NAME, tokenize

USER = [{"role": "user", "content": "Say hi"}]


def chat(server, **fields) -> httpx.Response:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 2, "temperature": 0.0, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers,
                      timeout=60)


def error(r: httpx.Response) -> tuple[str, str | None]:
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"], r.json()["error"]["param"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]?"},
     "guided_whitespace_pattern"),
    ({"structural_tag": json.dumps({"type": "structural_tag", "triggers": ["<f>"], "structures": [
        {"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]})}, "structural_tag"),
])
def test_unimplemented_vllm_fields_are_refused_by_name(server, fields, param):
    message, got = error(chat(server, **fields))
    assert (got, message) == (param, f"'{param}' is not supported by this server")


def test_neutral_values_of_the_refused_fields_are_served(server):
    r = chat(server, prompt_logprobs=None, guided_whitespace_pattern=None, structural_tag=None)
    assert r.status_code == 200, r.text


def stream_chunks(server, route: str = "chat/completions", **fields) -> list[dict]:
    asked = {"messages": USER} if route == "chat/completions" else {"prompt": ["Hi", "Hello there"]}
    body = {"model": MODEL_NAME, **asked, "temperature": 1.0, "seed": 3, "stream": True,
            "ignore_eos": True, **fields}
    with httpx.stream("POST", f"{server.url}/v1/{route}", json=body,
                      headers=server.headers, timeout=60) as r:
        assert r.status_code == 200
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_continuous_usage_counts_each_choice_from_zero(server):
    """vLLM's: the role chunk says 0 completion tokens; each later chunk, its own choice's tokens
    so far (not the total over the n choices); the last chunk, the request's total."""
    prompt = len(tokenize(server, messages=USER))
    chunks = stream_chunks(server, n=2, max_tokens=5, stream_options={
        "include_usage": True, "continuous_usage_stats": True})
    *per_choice, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
    counts: dict[int, list[int]] = {0: [], 1: []}
    for chunk in per_choice:
        (choice,) = chunk["choices"]
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == prompt
        assert usage["total_tokens"] == prompt + usage["completion_tokens"]
        assert usage["prompt_tokens_details"] == last["usage"]["prompt_tokens_details"]
        counts[choice["index"]].append(usage["completion_tokens"])
    for index in (0, 1):
        assert counts[index][0] == 0  # the role chunk
        assert counts[index] == sorted(counts[index]) and counts[index][-1] == 5


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_continuous_usage_alone_includes_usage(server, route):
    """vLLM's StreamOptions declares include_usage Optional[bool] = True: continuous_usage_stats
    alone gets usage in every chunk and the final usage chunk (3 tokens for each of the chat's
    one choice, or of the two prompts' choices)."""
    chunks = stream_chunks(server, route, max_tokens=3,
                           stream_options={"continuous_usage_stats": True})
    *per_choice, last = chunks
    assert per_choice and all(chunk["choices"] and chunk["usage"] for chunk in per_choice)
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == (3 if route == "chat/completions" else 6)


def test_completions_continuous_usage_counts_each_prompt_and_choice(server):
    """Each chunk: its own prompt's tokens and its own choice's tokens so far (vLLM's
    num_prompt_tokens[prompt_idx] and previous_num_tokens[i]), not the request's totals."""
    prompts = ["Hi", "Hello there"]
    lengths = [len(tokenize(server, prompt=p)) for p in prompts]
    chunks = stream_chunks(server, "completions", n=2, max_tokens=4, stream_options={
        "include_usage": True, "continuous_usage_stats": True})
    *per_choice, last = chunks
    assert last["usage"]["completion_tokens"] == 16 and last["usage"]["prompt_tokens"] == sum(lengths)
    counts: dict[int, list[int]] = {}
    for chunk in per_choice:
        (choice,) = chunk["choices"]
        usage = chunk["usage"]
        prompt = lengths[choice["index"] // 2]  # choices are numbered prompt by prompt
        assert usage["prompt_tokens"] == prompt
        assert usage["total_tokens"] == prompt + usage["completion_tokens"]
        counts.setdefault(choice["index"], []).append(usage["completion_tokens"])
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(c == sorted(c) and c[-1] == 4 for c in counts.values())


def test_completions_continuous_usage_counts_each_prompts_cached_tokens(server):
    """Each chunk's prompt_tokens_details, as chat's chunks carry them: its own prompt's tokens
    served by the prefix cache (they were null in completions' chunks). The first prompt, 40
    tokens no other test sends, was sent before: its two full 16-token blocks are cached; the
    second, 2 tokens, fills no block."""
    warm = [4100 + 7 * i for i in range(40)]
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": warm, "max_tokens": 1})
    assert r.status_code == 200, r.text
    chunks = stream_chunks(server, "completions", prompt=[warm, [4100, 4107]], n=2, max_tokens=2,
                           stream_options={"include_usage": True, "continuous_usage_stats": True})
    *per_choice, last = chunks
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    cached = {0: 32, 1: 32, 2: 0, 3: 0}  # choices are numbered prompt by prompt
    assert {chunk["choices"][0]["index"] for chunk in per_choice} == set(cached)
    for chunk in per_choice:
        expected = {"cached_tokens": cached[chunk["choices"][0]["index"]]}
        assert chunk["usage"]["prompt_tokens_details"] == expected


def whole(server, route: str, **fields) -> dict:
    asked = {"messages": USER} if route == "chat/completions" else {"prompt": "Hi"}
    r = httpx.post(f"{server.url}/v1/{route}", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, **asked, "max_tokens": 2, **fields})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_system_fingerprint_is_null_in_replies_and_chunks(server, route):
    """OpenAI documents system_fingerprint on the completion, the chat completion and the chat
    chunk; vLLM declares it Optional with a None default, so its JSON carries a null (it was
    missing)."""
    bodies = [whole(server, route),
              *stream_chunks(server, route, max_tokens=2, stream_options={"include_usage": True})]
    assert [body.get("system_fingerprint", "missing") for body in bodies] == [None] * len(bodies)


def test_a_reply_message_has_a_null_refusal_and_a_delta_none(server):
    """OpenAI's ChatCompletionResponseMessage requires refusal, null when the model did not
    refuse, as vLLM's ChatMessage sends it (it was missing); vLLM's DeltaMessage has none."""
    message = whole(server, "chat/completions")["choices"][0]["message"]
    assert message.get("refusal", "missing") is None
    deltas = [chunk["choices"][0]["delta"] for chunk in stream_chunks(server, max_tokens=2)]
    assert deltas and not any("refusal" in delta for delta in deltas)


@pytest.mark.parametrize(("fields", "param", "start"), [
    ({"max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens must be at least 1"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs must be in [0, 20]"),
])
def test_errors_name_the_field_the_client_sent(server, fields, param, start):
    message, got = error(chat(server, **fields))
    assert got == param and message.startswith(start)


def test_an_assistant_refusal_part_is_its_text(server):
    """OpenAI's assistant content may be refusal parts; vLLM renders the refusal as the text."""
    def conversation(content):
        return [*USER, {"role": "assistant", "content": content}, {"role": "user", "content": "ok"}]

    as_parts = tokenize(server, messages=conversation([{"type": "refusal", "refusal": "I can't"}]))
    assert as_parts == tokenize(server, messages=conversation("I can't"))
    assert chat(server, messages=conversation([{"type": "refusal", "refusal": "no"}])).status_code == 200


def test_a_bare_string_among_content_parts_is_a_text_part(server):
    """vLLM's chat_utils reads a string in a content list as a text part: joined as text parts
    are, in a chat request and in /tokenize's messages alike."""
    def user(content):
        return [{"role": "user", "content": content}]

    mixed = user(["Name a", {"type": "text", "text": "fruit."}])
    assert tokenize(server, messages=mixed) == tokenize(server, messages=user("Name a\nfruit."))
    assert chat(server, messages=user(["hi"]), max_tokens=1).status_code == 200
    image = {"type": "image_url", "image_url": {"url": "x"}}
    message, param = error(chat(server, messages=user(["hi", image])))
    assert "'image_url' is not supported" in message and param == "messages.0.content"


@pytest.mark.parametrize(("content", "role", "words"), [
    ([{"text": "Hi"}], "user", "a content part is an object with a 'type'"),
    ([{"type": "text"}], "user", "a 'text' content part needs a 'text' string"),
    ([{"type": "refusal"}], "assistant", "a 'refusal' content part needs a 'refusal' string"),
    ([{"type": "refusal", "refusal": "no"}], "user", "'refusal' parts in an assistant's message"),
])
def test_malformed_content_parts_say_what_is_wrong(server, content, role, words):
    message, param = error(chat(server, messages=[{"role": role, "content": content}]))
    assert words in message and param == "messages.0.content"


SCHEMA = {"type": "object"}


@pytest.mark.parametrize(("response_format", "words"), [
    ({}, "needs a 'type'"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": SCHEMA}},
     "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x" * 65, "schema": SCHEMA}}, "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA, "strict": "yes"}},
     "json_schema.strict"),
])
def test_malformed_response_format_is_refused(server, response_format, words):
    message, param = error(chat(server, response_format=response_format))
    assert words in message and param == "response_format"


def test_a_well_formed_json_schema_header_is_served(server):
    for header in ({"name": "x" * 64}, {"name": "a-b_9", "strict": None}, {"name": "c", "strict": False}):
        r = chat(server, response_format={"type": "json_schema", "json_schema": {**header, "schema": SCHEMA}})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("messages", "add_generation_prompt", "role"), [
    (USER, True, "assistant"),
    (USER, False, "user"),
    ([{"role": "system", "content": "Be brief."}], False, "system"),
    ([*USER, {"role": "assistant", "content": "Hi"}], False, "assistant"),
])
def test_the_reply_is_in_the_last_message_role_without_a_generation_prompt(
        server, messages, add_generation_prompt, role):
    """vLLM's get_chat_request_role: the assistant's when the generation prompt opens its turn,
    else the last message's (the reply goes on with that turn), in the whole reply's message and
    in each choice's first chunk; echo puts the last message first when it is in that role (it
    was always the assistant's, so a user's message was echoed under role "assistant")."""
    asked = {"messages": messages, "add_generation_prompt": add_generation_prompt, "echo": True}
    echo = messages[-1]["content"] if messages[-1]["role"] == role else ""
    message = chat(server, **asked).json()["choices"][0]["message"]
    assert message["role"] == role and message["content"].startswith(echo)
    chunks = stream_chunks(server, n=2, max_tokens=2, **asked)
    deltas = [(chunk["choices"][0]["index"], chunk["choices"][0]["delta"]) for chunk in chunks]
    assert deltas[:2] == [(0, {"role": role, "content": ""}), (1, {"role": role, "content": ""})]
    assert not any("role" in delta for _, delta in deltas[2:])
    streamed = "".join(delta.get("content", "") for index, delta in deltas if index == 0)
    assert streamed.startswith(echo)

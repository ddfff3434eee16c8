"""Every error the server can give: its status and the OpenAI error JSON shape, checked together."""

from __future__ import annotations

import http.client
import json
import socket

import httpx
import openai
import pytest
from server_helpers import MAX_MODEL_LEN, MODEL_NAME, requests_finished

TOOL = {"type": "function", "function": {"name": "f"}}
ERROR_KEYS = {"message", "type", "param", "code"}
# OpenAI's: an unknown model is a 404 of type invalid_request_error, code model_not_found
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error"}


def check_error(r: httpx.Response, status: int, param: str | None = None) -> str:
    """Assert the status and the shape; returns the message."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    error = body["error"]
    assert error["type"] == TYPES[status]
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"]
    assert error["param"] == param
    return error["message"]


def post(server, path: str, **kwargs) -> httpx.Response:
    headers = {**server.headers, **kwargs.pop("headers", {})}
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=60, **kwargs)


def completion(server, **fields) -> httpx.Response:
    return post(server, "/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", **fields})


def chat(server, **fields) -> httpx.Response:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return post(server, "/v1/chat/completions", json=body)


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": -3}, "max_tokens", "-3"),
    ({"temperature": -0.5}, "temperature", ">= 0"),
    ({"top_p": 0.0}, "top_p", "(0, 1]"),
    ({"top_p": 1.5}, "top_p", "1.5"),
    ({"max_tokens": "5"}, "max_tokens", "integer"),
    ({"temperature": "hot"}, "temperature", "number"),
    ({"stream": "yes"}, "stream", "boolean"),
    ({"n": 1.5}, "n", "integer"),
    ({"stop": 7}, "stop", "wrong type"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": {"text": "Hi"}}, "prompt", "wrong type"),
    # each alternative failed at its own place: once the string's "Input should be a valid string"
    ({"prompt": [1, "a"]}, "prompt", "'prompt' has the wrong type (list) or an invalid value"),
    ({"prompt": [[1, 2], [3, "a"]]}, "prompt", "'prompt' has the wrong type (list)"),
    # two unions wrong: the first reported as a union (it was "'stop': Input should be a valid string")
    ({"prompt": [1, "a"], "stop": 7}, "stop", "'stop' has the wrong type (int) or an invalid value"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ({"suffix": "and then"}, "suffix", "not supported"),
    ({"logit_bias": {"abc": 10}}, "logit_bias", "token ids"),
    ({"logit_bias": {"50": 150}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"9999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"50": "x"}}, "logit_bias.50", "number"),
    ({"best_of": 3}, "best_of", "not supported"),
    # any best_of but n's is refused as unsupported, below n too (1 once passed as harmless, then
    # was told to be at least n, as if a larger one would be served)
    ({"best_of": 1, "n": 3}, "best_of", "'best_of' is not supported by this server"),
    ({"best_of": 0}, "best_of", "'best_of' is not supported by this server"),
    ({"best_of": True}, "best_of", "'best_of' must be an integer, got True"),  # was taken as 1
    # vLLM's extensions that would change the answer: refused, not silently ignored
    ({"logits_processors": ["my.module.Processor"]}, "logits_processors", "not supported"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty"),
    ({"allowed_token_ids": [9999999]}, "allowed_token_ids", "outside the vocabulary"),
    # with min_tokens these were held back by indexing the logits: it killed the engine loop
    ({"stop_token_ids": [9999999], "min_tokens": 2}, "stop_token_ids", "outside the vocabulary"),
    ({"stop_token_ids": [-1], "min_tokens": 2}, "stop_token_ids", "must be token ids"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "whitespace_pattern is not supported"),
    ({"structured_outputs": {"structural_tag": "{"}}, "structured_outputs", "structural tag's text is not JSON"),
    ({"response_format": {"type": "structural_tag", "structures": []}}, "response_format", "a structural tag is"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar", "rule 'x' is used but never defined"),
    ({"structured_outputs": {"grammar": "root ::= \"a"}}, "structured_outputs", "a string is not closed"),
    ({"guided_grammar": "root ::= \"a\"", "structured_outputs": {"grammar": "root ::= \"b\""}}, "guided_grammar",
     "give the grammar once"),
    ({"guided_regex": "(a"}, "guided_regex", "missing ')'"),
    # guides that match no text once forced an end at once and answered "stop"
    ({"guided_regex": "a[^\\s\\S]"}, "guided_regex", "it matches no text"),
    ({"guided_grammar": "root ::= [^\\x00-\\U0010ffff]"}, "guided_grammar", "matches no text"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex", "give the regex once"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "guided_choice and guided_regex cannot"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs", "is not JSON"),
    ({"guided_json": {"$ref": "#/$defs/none"}}, "guided_json", "points at nothing"),
    # the engine's refusals of a guide name the field the client gave it by, not the engine's
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"$ref": "#/x"}}}},
     "response_format", "points at nothing"),
    ({"structured_outputs": {"json": {"$ref": "#/x"}}}, "structured_outputs", "points at nothing"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs", "missing ')'"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty list"),
    ({"structured_outputs": {"json_object": True}, "ignore_eos": True}, "structured_outputs",
     "cannot be combined"),
    # both guides named as sent (the second once kept the engine's name)
    ({"structured_outputs": {"json": {"type": "integer"}}, "guided_choice": ["a"]}, "guided_choice",
     "guided_choice and structured_outputs.json cannot be combined"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs",
     "structured_outputs.choice and structured_outputs.regex cannot be combined"),
    # the client's own values are quoted as sent, never renamed
    ({"response_format": {"type": "json_object"}, "guided_choice": ["json_object", ""]}, "guided_choice",
     "got ['json_object', '']"),
    ({"guided_json": {"type": "integer"}, "response_format": {"type": "json_object"}}, "response_format",
     "response_format and guided_json cannot be combined"),
    ({"guided_json": {"type": "object"}, "structured_outputs": {"json": {}}}, "structured_outputs",
     "give the JSON schema once"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs", "true or false"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice",
     "cannot be combined"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format",
     "cannot be combined"),
    ({"guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}}, "guided_choice", "once"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["yes"], "ignore_eos": True}, "guided_choice", "cannot be combined"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "at least 1"),
    ({"truncate_prompt_tokens": 100_000}, "truncate_prompt_tokens", "is over the context length"),
    ({"bad_words": [" "]}, "bad_words", "blank"),
    ({"cache_salt": ""}, "cache_salt", "non-empty"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "[0, 20]"),
    ({"priority": 2}, "priority", "--scheduling-policy priority"),  # this server is fcfs
    ({"seed": 2**70}, "seed", "2**64"),  # beyond torch's generators: it once killed the engine
    ({"seed": 2**64 - 1, "n": 2}, "seed", "copies"),  # the second copy's seed would be 2**64
    ({"tools": [TOOL]}, "tools", "not supported"),  # chat's, not completions'
])
def test_invalid_completion_fields_are_400_naming_the_field(server, fields, param, words):
    assert words in check_error(completion(server, **fields), 400, param)


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"messages": []}, "messages", "empty"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "wrong type"),
    ({"messages": [{"content": "Hi"}]}, "messages.0.role", "required"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content", "image_url"),
    ({"tools": [TOOL]}, "tool_choice", "--enable-auto-tool-choice"),  # "auto" by default
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice", "'g' is not among"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", 'must be "none"'),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [TOOL, TOOL], "tool_choice": "required"}, "tools", "unique"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}}],
      "tool_choice": "required"}, "tools.0.function.parameters", "tool 'f': parameters: JSON schema keyword 'multipleOf'"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "none"},
     "tools.0.function.name", "at least 1 character"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "needs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": None}}},
     "response_format", "needs"),  # once no guide at all
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"multipleOf": 3}}}},
     "response_format", "keyword 'multipleOf' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
      "guided_json": {"type": "object"}}, "response_format", "give the JSON schema once"),
    ({"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined"),
    ({"stop": ["logprobs", ""]}, "stop", "got ['logprobs', '']"),  # once "['top_logprobs', '']"
    ({"tools": [TOOL], "tool_choice": "required", "min_tokens": 2}, "tool_choice",
     "cannot be combined with"),  # the forced call's guide, once named json_schema
    ({"response_format": {"type": "grammar"}}, "response_format", "'grammar' is not supported"),
    ({"top_logprobs": 2}, "top_logprobs", "logprobs"),
    ({"continue_final_message": True}, "continue_final_message", "add_generation_prompt"),
    ({"chat_template": "{{ messages }}"}, "chat_template", "not supported"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
])
def test_invalid_chat_fields_are_400_naming_the_field(server, fields, param, words):
    assert words in check_error(chat(server, **fields), 400, param)


def test_neutral_values_of_unsupported_fields_are_accepted(server):
    for choice in ("none", "auto"):  # no tools to call (clients send both): a plain reply
        assert chat(server, tools=[], tool_choice=choice, max_tokens=2).status_code == 200
    r = chat(server, tools=[], tool_choice="none", response_format={"type": "text"}, max_tokens=2,
             store=False, metadata={"who": "test"}, echo=False, add_special_tokens=False,
             continue_final_message=False, spaces_between_special_tokens=True)
    assert r.status_code == 200, r.text
    r = completion(server, max_tokens=2, add_special_tokens=True, priority=0, echo=False,
                   prompt_logprobs=None)
    assert r.status_code == 200, r.text


def test_unknown_fields_are_served_and_logged_by_name(server, caplog):
    """As vLLM: a field no route declares is ignored, with a warning naming it (a misspelt
    max_token would otherwise pass unseen)."""
    with caplog.at_level("WARNING", logger="inferlab.server"):
        r = completion(server, max_tokens=2, max_token=5, foo_bar=1)
        assert r.status_code == 200, r.text
    assert "fields present in the request but ignored: foo_bar, max_token" in caplog.messages
    caplog.clear()
    with caplog.at_level("WARNING", logger="inferlab.server"):
        assert completion(server, max_tokens=2).status_code == 200
    assert not [m for m in caplog.messages if "ignored" in m]


def test_integers_past_int64_are_served_or_refused_never_fatal(server):
    """JSON integers have no bound: top_k 2**63 once overflowed the sampler's int64 tensor mid-step
    and stopped the engine, so every later request got 503. Past the vocabulary top_k keeps every
    token (vLLM's reading); a seed past torch's range is a 400."""
    for top_k in (2**63, 10**30):
        r = completion(server, max_tokens=2, temperature=1.0, top_k=top_k, seed=1)
        assert r.status_code == 200, r.text
    assert "seed" in check_error(completion(server, max_tokens=2, seed=2**64), 400, "seed")
    assert completion(server, max_tokens=2).status_code == 200  # the engine still serves


def test_prompt_over_the_context_is_400_with_the_numbers(server):
    prompt = "hello " * 100
    count = post(server, "/tokenize", json={"prompt": prompt}).json()["count"]
    message = check_error(completion(server, prompt=prompt, max_tokens=500), 400, "prompt")
    for number in (count, 500, count + 500, MAX_MODEL_LEN):
        assert str(number) in message
    long_ids = [1000] * (MAX_MODEL_LEN + 10)
    assert str(MAX_MODEL_LEN + 10) in check_error(completion(server, prompt=long_ids), 400, "prompt")


def test_token_ids_outside_the_vocabulary_are_400(server):
    assert "vocabulary" in check_error(completion(server, prompt=[1, 2, 10**9]), 400, "prompt")
    assert "vocabulary" in check_error(post(server, "/detokenize", json={"tokens": [-1]}), 400,
                                       "tokens")


@pytest.mark.parametrize(("path", "fields", "param", "code", "words"), [
    # OpenAI's answer to a chat too long: {"param": "messages", "code": "context_length_exceeded"}
    ("/v1/chat/completions", {"max_tokens": 100_000}, "messages", "context_length_exceeded",
     "is over the context length 512"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 200_000}]}, "messages",
     "context_length_exceeded", "characters) has at least"),  # refused before it is encoded
    ("/v1/completions", {"prompt": [1] * MAX_MODEL_LEN}, "prompt", "context_length_exceeded",
     "no room for output"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 100_000}, "prompt", "context_length_exceeded",
     "is over the context length 512"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 100_000, "use_beam_search": True, "n": 2},
     "prompt", "context_length_exceeded", "is over the context length 512"),
    # no max_tokens: it once said "max_tokens is -1", a value the request never gave
    ("/v1/completions", {"prompt": [1] * (MAX_MODEL_LEN + 1), "use_beam_search": True, "n": 2},
     "prompt", "context_length_exceeded", f"has {MAX_MODEL_LEN + 1} tokens, the context holds 512: no room"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, "prompt", "invalid_value", "outside the vocabulary"),
    ("/v1/completions", {"prompt": ""}, "prompt", "invalid_value", "the prompt is empty"),
])
def test_a_prompt_the_model_cannot_take_names_the_prompts_field(server, path, fields, param, code,
                                                                 words):
    body = {"model": MODEL_NAME, **({"messages": [{"role": "user", "content": "Hi"}]}
                                    if path.endswith("chat/completions") else {}), **fields}
    r = post(server, path, json=body)
    assert words in check_error(r, 400, param)
    assert r.json()["error"]["code"] == code


def test_a_request_refused_for_one_prompt_runs_and_counts_none(server):
    """The first prompt is fine, the second holds an id outside the vocabulary: a 400, and, as
    vLLM checks every prompt first, the first never ran. A request of 3 prompt tokens and 1
    output token after it (its reply comes once the engine has counted it, and whatever was
    sent before) moves the totals by its own counts alone. The refused one's first prompt
    once ran and was aborted: 6 prompt tokens more, a generated one."""
    def read() -> list[float]:
        return [server.metric("vllm:prompt_tokens_total"),
                server.metric("vllm:generation_tokens_total"), requests_finished(server)]

    before = read()
    prompts = [[504, 1834, 28, 638, 359, 346], [10**8]]
    assert "vocabulary" in check_error(completion(server, prompt=prompts, max_tokens=2), 400, "prompt")
    after = completion(server, prompt=[2000, 2011, 2022], max_tokens=1, ignore_eos=True)
    assert after.status_code == 200
    assert [a - b for a, b in zip(read(), before, strict=True)] == [3, 1, 1]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "\ud800"}]}),
])
def test_text_with_a_lone_surrogate_is_400(server, path, body):
    # valid JSON (json.dumps writes the escape "\\ud800") but not Unicode text: once a 500
    r = post(server, path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert "surrogate" in check_error(r, 400)


@pytest.mark.parametrize("field", ["guided_choice", "bad_words"])
def test_a_lone_surrogate_in_a_field_s_texts_is_400_naming_it(server, field):
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2, field: ["yes", "\ud800"]}
    r = post(server, "/v1/completions", content=json.dumps(body).encode(),
             headers={"content-type": "application/json"})
    assert "surrogate" in check_error(r, 400, field)


@pytest.mark.parametrize(("body", "words"), [
    (b'{"model": "x", "prompt": ', "not valid JSON"),
    (b'{"prompt": "caf\xe9"}', "not valid UTF-8"),
    (b'["prompt", "Hi"]', "JSON object"),
    (b'{"prompt": "Hi", "temperature": NaN}', "NaN"),
    (b"", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
])
def test_malformed_bodies_are_400_never_500(server, body, words):
    r = post(server, "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert words in check_error(r, 400)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_415(server, content_type):
    """What curl -d sends without -H: once read as JSON regardless."""
    headers = {"content-type": content_type} if content_type else {}
    r = post(server, "/v1/completions", content=b'{"prompt": "Hi"}', headers=headers)
    said = "not " + content_type if content_type else "and it came with no Content-Type"
    assert check_error(r, 415).endswith(f"Content-Type: application/json, {said}")


def test_missing_field_is_400(server):
    r = post(server, "/v1/completions", json={"model": MODEL_NAME})
    assert "'prompt' is required" in check_error(r, 400, "prompt")


def test_missing_or_wrong_api_key_is_401(server):
    url = f"{server.url}/v1/completions"
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": server.api_key},
                    {"Authorization": f"Basic {server.api_key}"}):
        check_error(httpx.post(url, json=body, headers=headers, timeout=30), 401)
    check_error(httpx.get(f"{server.url}/v1/models", timeout=30), 401)
    # the unauthenticated endpoints stay open
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_unknown_model_and_route_are_404(server, client):
    message = check_error(completion(server, model="gpt-4"), 404, "model")
    assert "gpt-4" in message and MODEL_NAME in message
    check_error(post(server, "/v1/embeddings", json={"input": "Hi"}), 404)
    check_error(httpx.get(f"{server.url}/no/such/page", timeout=30), 404)
    check_error(httpx.get(f"{server.url}/v1/completions", headers=server.headers, timeout=30), 405)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "Hi"}])


def test_body_over_the_limit_is_413(server):
    big = "x" * (2**20 + 10)
    check_error(completion(server, prompt=big), 413)
    # declared too big to read at all: refused from the header, before any body is sent
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {server.api_key}\r\n"
                     f"Content-Length: {100 * 2**20}\r\n\r\n".encode())
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        assert reply.status == 413
        assert json.loads(reply.read())["error"]["type"] == "invalid_request_error"


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=-1)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "max_tokens"

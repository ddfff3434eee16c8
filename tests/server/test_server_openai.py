"""The server through the official `openai` client: completions (chat: test_server_chat.py), whole
and streamed.

References are independent of the code under test: streamed text must equal the whole text,
token counts must match /tokenize, stop strings are cut where str.find says, sampled-token
logprobs must match the same tokens' prompt logprobs computed by a prefill, and the chat
prompt must be the SmolLM2 template written out by hand.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from server_helpers import MAX_MODEL_LEN, MODEL_NAME, tokenize

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0}


def test_models_lists_the_served_name(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("no-such-model")
    version = httpx.get(f"{server.url}/version", timeout=10).json()
    assert version["version"].count(".") == 2


@pytest.mark.parametrize("path", ["/metrics", "/health", "/ping", "/v1/models",
                                  f"/v1/models/{MODEL_NAME}", "/version"])
def test_head_answers_as_get_without_the_body(server, path):
    """As HTTP has it (RFC 9110 9.3.2), and as Starlette's routes and prometheus_client's app
    answer: GET's status and content type, no body. It was 405."""
    get = httpx.get(f"{server.url}{path}", headers=server.headers, timeout=10)
    head = httpx.head(f"{server.url}{path}", headers=server.headers, timeout=10)
    assert head.status_code == get.status_code == 200
    assert head.headers.get("content-type") == get.headers.get("content-type")
    assert head.content == b""
    assert httpx.head(f"{server.url}/v1/models", timeout=10).status_code == 401  # still keyed


def test_ping_is_health_by_vllms_other_name_get_or_post(server):
    # vLLM serves SageMaker's /ping, GET and POST, unkeyed, as /health
    for method in ("GET", "POST"):
        assert httpx.request(method, f"{server.url}/ping", timeout=10).status_code == 200


def test_completion_stream_equals_whole_and_usage_matchestokenize(client, server):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12,
                                      extra_body={"ignore_eos": True}, **GREEDY)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tokenize(server, prompt=PROMPT))
    assert whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12

    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}, **GREEDY))
    *content, last = chunks
    assert "".join(c.choices[0].text for c in content) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in content][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert all(c.usage is None for c in content)
    assert last.choices == [] and last.usage == whole.usage


def test_usage_counts_the_prompt_tokens_served_by_the_prefix_cache(client):
    """OpenAI's usage.prompt_tokens_details.cached_tokens: 40 prompt tokens no other test
    sends, twice: none cached, then the two full 16-token blocks (the last token is always
    computed)."""
    prompt = [3100 + 7 * i for i in range(40)]
    first, second = (client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
                     for _ in range(2))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 32


def test_continuous_usage_stats_count_up_in_every_chunk(client):
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}, **GREEDY))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}


def test_n_and_seed_are_reproducible_and_independent(client):
    def sample(seed: int):
        out = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", n=3,
                                        max_tokens=12, temperature=1.0, seed=seed,
                                        extra_body={"ignore_eos": True})
        assert [c.index for c in out.choices] == [0, 1, 2]
        assert out.usage.completion_tokens == 3 * 12
        return [c.text for c in out.choices]

    first = sample(seed=7)
    assert sample(seed=7) == first  # same seed, same samples
    assert len(set(first)) > 1  # the n completions are independent draws
    assert sample(seed=8) != first


def test_stop_string_cuts_where_it_first_occurs(client):
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16,
                                     extra_body={"ignore_eos": True}, **GREEDY).choices[0].text
    middle = len(full) // 2
    stop = full[middle:middle + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    expected = full[:full.find(stop)]

    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, stop=[stop],
                                      extra_body={"ignore_eos": True}, **GREEDY).choices[0]
    assert (whole.text, whole.finish_reason) == (expected, "stop")
    assert whole.model_extra["stop_reason"] == stop
    streamed = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16,
                                              stop=stop, stream=True,
                                              extra_body={"ignore_eos": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"
    # vLLM's include_stop_str_in_output: the same cut, after the stop string
    included = {"ignore_eos": True, "include_stop_str_in_output": True}
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, stop=[stop],
                                      extra_body=included, **GREEDY).choices[0]
    assert (whole.text, whole.finish_reason) == (expected + stop, "stop")
    streamed = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16,
                                              stop=stop, stream=True, extra_body=included, **GREEDY))
    assert "".join(c.choices[0].text for c in streamed) == expected + stop


def test_prompt_truncation_and_special_tokens(client, server):
    """truncate_prompt_tokens keeps the last k tokens (usage says k, and the completion is the
    one of those k tokens alone); bad_words keeps a word out; skip_special_tokens=False writes
    out a forced EOS."""
    ids = tokenize(server, prompt=PROMPT)
    cut = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, **GREEDY,
                                    extra_body={"truncate_prompt_tokens": 3, "ignore_eos": True})
    alone = client.completions.create(model=MODEL_NAME, prompt=ids[-3:], max_tokens=5, **GREEDY,
                                      extra_body={"ignore_eos": True})
    assert cut.usage.prompt_tokens == 3 and cut.choices[0].text == alone.choices[0].text
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, **GREEDY)
    barred = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, **GREEDY,
                                       extra_body={"bad_words": ["Paris"]})
    assert "Paris" in plain.choices[0].text and "Paris" not in barred.choices[0].text
    (eos,) = tokenize(server, prompt="<|im_end|>", add_special_tokens=False)
    forced = {"ignore_eos": True, "skip_special_tokens": False}
    shown = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, **GREEDY,
                                      logit_bias={str(eos): 100}, extra_body=forced)
    assert shown.choices[0].text == "<|im_end|>" * 2


def test_logprobs_match_a_prefill_of_the_same_tokens(client, server):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, logprobs=2,
                                    extra_body={"ignore_eos": True}, **GREEDY).choices[0]
    lp = out.logprobs
    assert "".join(lp.tokens) == out.text and len(lp.tokens) == 6
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert token in top and top[token] == logprob
        assert logprob == max(top.values())  # greedy picks the most likely token
        assert len(top) == 2  # the chosen token is one of the top 2
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets

    # Echo the prompt plus those 6 tokens: a prefill scores the same tokens again.
    ids = tokenize(server, prompt=PROMPT)
    both = tokenize(server, prompt=PROMPT + out.text)
    assert both[:len(ids)] == ids and len(both) == len(ids) + 6
    echo = client.completions.create(model=MODEL_NAME, prompt=both, max_tokens=1, logprobs=1,
                                     echo=True, **GREEDY).choices[0]
    assert echo.text.startswith(PROMPT + out.text)
    prompt_lp = echo.logprobs
    assert prompt_lp.token_logprobs[0] is None and prompt_lp.top_logprobs[0] is None
    assert "".join(prompt_lp.tokens[:len(both)]) == PROMPT + out.text
    assert prompt_lp.token_logprobs[len(ids):len(both)] == pytest.approx(lp.token_logprobs,
                                                                          abs=2e-3)

    # vLLM's prompt_logprobs: the same numbers by token id, each with its rank and the top 2
    scored = client.completions.create(model=MODEL_NAME, prompt=both, max_tokens=1, **GREEDY,
                                       extra_body={"prompt_logprobs": 2}).choices[0]
    by_id = scored.model_extra["prompt_logprobs"]
    assert len(by_id) == len(both) and by_id[0] is None
    for i in range(1, len(both)):
        own = by_id[i][str(both[i])]
        assert next(iter(by_id[i])) == str(both[i])  # the prompt's token first, as vLLM lists it
        assert own["logprob"] == prompt_lp.token_logprobs[i]
        assert own["decoded_token"] == prompt_lp.tokens[i]
        ranked = sorted(by_id[i].values(), key=lambda e: e["rank"])
        assert len(by_id[i]) <= 3 and ranked[0]["rank"] == 1
        assert ranked[0]["logprob"] == max(e["logprob"] for e in by_id[i].values())
    streamed = list(client.completions.create(model=MODEL_NAME, prompt=both, max_tokens=3, stream=True,
                                              extra_body={"prompt_logprobs": 2, "ignore_eos": True},
                                              **GREEDY))
    firsts = [c.choices[0].model_extra.get("prompt_logprobs") for c in streamed if c.choices]
    assert firsts[0] == by_id and all(f is None for f in firsts[1:])

    # max_tokens 0 with echo (how clients score a text): the prompt and its logprobs alone,
    # whole or streamed; it was a 400
    alone = client.completions.create(model=MODEL_NAME, prompt=both, max_tokens=0, logprobs=1,
                                      echo=True).choices[0]
    assert alone.text == PROMPT + out.text and alone.finish_reason == "length"
    whole = client.completions.create(model=MODEL_NAME, prompt=both, max_tokens=0, echo=True)
    assert whole.usage.completion_tokens == 0  # it counted the sampled token the reply drops
    assert whole.usage.total_tokens == whole.usage.prompt_tokens == len(both)
    assert alone.logprobs.tokens == prompt_lp.tokens[:len(both)]
    assert alone.logprobs.token_logprobs == prompt_lp.token_logprobs[:len(both)]
    chunks = [c.choices[0] for c in client.completions.create(
        model=MODEL_NAME, prompt=both, max_tokens=0, echo=True, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == PROMPT + out.text
    assert chunks[-1].finish_reason == "length"


def test_text_offsets_of_a_characters_byte_tokens_are_where_it_begins(client):
    """Each emoji here is three byte tokens, each alone U+FFFD: all three begin at the emoji,
    whole or streamed (moving on by one U+FFFD each ran past the two-character text)."""
    asked = {"model": MODEL_NAME, "prompt": "Party:", "max_tokens": 8, "logprobs": 1,
             "extra_body": {"guided_regex": "🎉🎈"}, **GREEDY}
    out = client.completions.create(**asked).choices[0]
    assert out.text == "🎉🎈" and out.logprobs.tokens == ["\ufffd"] * 6 + ["<|im_end|>"]
    assert out.logprobs.text_offset == [0, 0, 0, 1, 1, 1, 2]
    streamed = [o for chunk in client.completions.create(**asked, stream=True)
                for o in (chunk.choices[0].logprobs.text_offset if chunk.choices[0].logprobs else [])]
    assert streamed == [0, 0, 0, 1, 1, 1, 2]


def test_logprobs_can_name_tokens_by_id(client, server):
    """return_tokens_as_token_ids: the same logprobs, each token named "token_id:<id>", and
    /detokenize of each id gives the text the plain request named it by; the text offsets stay
    those of the text (they once moved on by the names' lengths)."""
    asked = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "logprobs": 1, **GREEDY}
    plain = client.completions.create(**asked, extra_body={"ignore_eos": True}).choices[0].logprobs
    named = client.completions.create(**asked, extra_body={
        "ignore_eos": True, "return_tokens_as_token_ids": True}).choices[0].logprobs
    assert all(t.startswith("token_id:") for t in named.tokens)
    texts = [httpx.post(f"{server.url}/detokenize", json={"tokens": [int(t.removeprefix("token_id:"))]},
                        headers=server.headers, timeout=30).json()["prompt"] for t in named.tokens]
    assert texts == plain.tokens and named.token_logprobs == plain.token_logprobs
    assert named.text_offset == plain.text_offset == [sum(map(len, texts[:i])) for i in range(4)]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True,
        top_logprobs=1, extra_body={"return_tokens_as_token_ids": True}, **GREEDY)
    assert all(e.token.startswith("token_id:") for e in chat.choices[0].logprobs.content)


def test_cache_salt_keeps_prefix_hits_within_a_salt(client, server):
    """The same 100-word prompt under salt "a", then "b" (no hit), then "a" again (hits)."""
    prompt = "salted prefix " * 50
    hits = lambda: server.metric("vllm:prefix_cache_hits_total")  # noqa: E731

    def send(salt: str) -> None:
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1,
                                  extra_body={"cache_salt": salt})

    send("a")
    time.sleep(0.2)  # /metrics reads a snapshot the engine takes after each step
    before = hits()
    send("b")
    time.sleep(0.2)
    assert hits() == before
    send("a")
    deadline = time.monotonic() + 5
    while hits() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hits() > before


def test_a_lone_surrogate_salt_is_served_and_the_engine_lives_on(server):
    """JSON's "\\ud800" escape is a legal salt; hashing it once stopped the engine thread."""
    for salt in ("\ud800", "\ud800", None):
        body = {"model": MODEL_NAME, "prompt": "salted " * 20, "max_tokens": 1}
        if salt:
            body["cache_salt"] = salt
        # json.dumps writes the lone surrogate as its escape, as JavaScript's JSON.stringify does
        r = httpx.post(f"{server.url}/v1/completions", content=json.dumps(body),
                       headers={**server.headers, "Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"


def test_add_special_tokens_decides_the_bos(client, server, engine, monkeypatch):
    """With a tokenizer that adds a BOS (as Llama's GGUF files ask), a completion's text prompt
    gets it unless add_special_tokens is false, and a chat prompt only when it is true."""
    tokenizer = engine.tokenizer
    plain = tokenize(server, prompt=PROMPT, add_special_tokens=False)
    messages = [{"role": "user", "content": "Say hi"}]
    chat_ids = tokenize(server, messages=messages)
    # SmolLM2's own BOS is <|im_start|>, which its chat template writes first anyway
    monkeypatch.setattr(tokenizer, "bos_token_id", tokenizer.backend.token_to_id("<|endoftext|>"))
    monkeypatch.setattr(tokenizer.info, "add_bos_token", True)

    def completion_tokens(**fields) -> int:
        return client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1,
                                         extra_body=fields).usage.prompt_tokens

    def chat_tokens(**fields) -> int:
        return client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1,
                                              extra_body=fields).usage.prompt_tokens

    assert completion_tokens() == len(plain) + 1
    assert completion_tokens(add_special_tokens=False) == len(plain)
    assert chat_tokens() == len(chat_ids) and chat_tokens(add_special_tokens=True) == len(chat_ids) + 1
    bos_first = tokenize(server, messages=messages, add_special_tokens=True)
    assert bos_first == [tokenizer.bos_token_id, *chat_ids]


def test_prompt_forms_give_the_same_completions(client, server):
    single = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8,
                                       extra_body={"ignore_eos": True}, **GREEDY).choices[0].text
    other = "My favourite colour is"
    both = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, other], max_tokens=8,
                                     extra_body={"ignore_eos": True}, **GREEDY)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == single
    ids = tokenize(server, prompt=PROMPT)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=8,
                                       extra_body={"ignore_eos": True}, **GREEDY)
    assert by_ids.choices[0].text == single
    nested = client.completions.create(model=MODEL_NAME, prompt=[ids, tokenize(server, prompt=other)],
                                       max_tokens=8, extra_body={"ignore_eos": True}, **GREEDY)
    assert [c.text for c in nested.choices] == [c.text for c in both.choices]
    assert nested.usage.prompt_tokens == both.usage.prompt_tokens


# SmolLM2-Instruct's chat template, written out by hand: default system turn, then the user.
def test_logit_bias_forces_and_bans_tokens(client, server):
    """+100 on the id /tokenize gives for " the" makes a greedy completion " the the the
    the"; -100 on the greedy first token gives the runner-up of the unbiased top logprobs."""
    (the,) = tokenize(server, prompt=" the", add_special_tokens=False)
    forced = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4,
                                       logit_bias={str(the): 100}, **GREEDY)
    assert forced.choices[0].text == " the" * 4 and forced.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2, logit_bias={str(the): 100}, **GREEDY)
    assert chat.choices[0].message.content == " the" * 2
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1, logprobs=2,
                                      **GREEDY).choices[0].logprobs.top_logprobs[0]
    first, runner_up = sorted(plain, key=plain.get, reverse=True)
    (first_id,) = tokenize(server, prompt=first, add_special_tokens=False)
    banned = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1,
                                       logit_bias={str(first_id): -100}, **GREEDY)
    assert banned.choices[0].text == runner_up


def test_tokenize_detokenize_round_trip(server, hf_smollm_tokenizer):
    text = "Paged attention, continuous batching: 42 tokens/s."
    ids = tokenize(server, prompt=text, add_special_tokens=False)
    r = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, headers=server.headers,
                   timeout=30)
    assert r.status_code == 200 and r.json() == {"prompt": text}
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, headers=server.headers,
                   timeout=30)
    assert r.json()["count"] == len(r.json()["tokens"]) and r.json()["max_model_len"] == MAX_MODEL_LEN
    assert r.json()["token_strs"] is None
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text, "return_token_strs": True},
                   headers=server.headers, timeout=30)  # vLLM's: each token's vocabulary entry
    assert r.json()["token_strs"] == hf_smollm_tokenizer.convert_ids_to_tokens(r.json()["tokens"])

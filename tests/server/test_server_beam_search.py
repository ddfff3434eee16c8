"""vLLM's use_beam_search through the `openai` client: the n best beams as the choices, the same
as transformers' beam search, whole or streamed; what it cannot take is refused by name; a
client that leaves mid-search leaves nothing running."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from server_helpers import MODEL_NAME, requests_finished, tokenize, wait_until
from test_server_robustness import engine_idle

PROMPT = "The capital of France is"
BEAMS = {"n": 3, "max_tokens": 6, "extra_body": {"use_beam_search": True, "ignore_eos": True}}


@pytest.fixture(scope="module")
def reference_beams(fp32_server, hf_smollm) -> list[list[int]]:
    """transformers' 3 beams of 6 tokens, no end token taken (as ignore_eos)."""
    ids = tokenize(fp32_server, prompt=PROMPT)
    never = hf_smollm.config.vocab_size - 1
    with torch.no_grad():
        rows = hf_smollm.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  do_sample=False, num_beams=3, num_return_sequences=3, max_new_tokens=6,
                                  eos_token_id=never, pad_token_id=never)
    return [row[len(ids):].tolist() for row in rows]


def test_completions_beams_are_transformers_beams(fp32_client, fp32_server, reference_beams):
    """The choices are the beams, best first, whole and streamed; usage counts every beam."""
    whole = fp32_client.completions.create(model=MODEL_NAME, prompt=PROMPT, **BEAMS)
    texts = [c.text for c in whole.choices]
    expected = [httpx.post(f"{fp32_server.url}/detokenize", headers=fp32_server.headers,
                           json={"tokens": beam}).json()["prompt"] for beam in reference_beams]
    assert texts == expected and len(set(texts)) == 3
    assert [c.finish_reason for c in whole.choices] == ["length"] * 3
    assert whole.usage.completion_tokens == 18
    streamed = [""] * 3
    for chunk in fp32_client.completions.create(model=MODEL_NAME, prompt=PROMPT, stream=True, **BEAMS):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts


def test_beams_report_logprobs_of_the_reference_distribution(fp32_client, fp32_server, hf_smollm):
    """logprobs=2 with beam search: each beam token's logprob is the model's (a transformers
    forward pass), with its top 2."""
    named = {**BEAMS, "extra_body": {**BEAMS["extra_body"], "return_tokens_as_token_ids": True}}
    out = fp32_client.completions.create(model=MODEL_NAME, prompt=PROMPT, logprobs=2, **named)
    ids = tokenize(fp32_server, prompt=PROMPT)
    for choice in out.choices:
        beam = [int(token.removeprefix("token_id:")) for token in choice.logprobs.tokens]
        with torch.no_grad():
            logits = hf_smollm(torch.tensor([ids + beam])).logits[0]
        rows = torch.log_softmax(logits.float(), dim=-1)[len(ids) - 1:-1]
        expected = rows.gather(1, torch.tensor(beam)[:, None])[:, 0].tolist()
        assert len(choice.logprobs.token_logprobs) == len(beam) == 6
        assert all(abs(a - b) < 1e-3 for a, b in zip(choice.logprobs.token_logprobs, expected, strict=True))
        assert all(2 <= len(top) <= 3 for top in choice.logprobs.top_logprobs)


def test_chat_beams(fp32_client):
    chat = fp32_client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Name a fruit."}], n=2, max_tokens=12,
        extra_body={"use_beam_search": True, "length_penalty": 0.5})
    assert len(chat.choices) == 2 and chat.choices[0].message.content != chat.choices[1].message.content
    assert all(c.finish_reason in ("stop", "length") for c in chat.choices)


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"use_beam_search": True, "seed": 3}, "seed", "beam search does not take 'seed'"),
    ({"use_beam_search": True, "stop": ["."]}, "stop", "does not take 'stop'"),
    ({"use_beam_search": True, "n": 11}, "n", "n must be in [1, 10] (the number of beams), got 11"),
    ({"length_penalty": 0.5}, "length_penalty", "needs 'use_beam_search'"),
    ({"use_beam_search": True, "max_tokens": 10**6}, "prompt", "is over the context length"),
])
def test_what_beam_search_cannot_take_is_refused(fp32_server, fields, param, words):
    r = httpx.post(f"{fp32_server.url}/v1/completions", headers=fp32_server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": PROMPT, **fields})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == param


def test_a_bad_beam_search_field_is_named_not_blamed_on_n(fp32_server):
    """Once "length_penalty must be a finite number, got -inf (n is the beam width)", param n."""
    body = (f'{{"model": "{MODEL_NAME}", "prompt": "Hi", "use_beam_search": true, "n": 2, '
            f'"length_penalty": -1e400}}')
    r = httpx.post(f"{fp32_server.url}/v1/completions", content=body, timeout=60,
                   headers={**fp32_server.headers, "Content-Type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "length_penalty", r.text
    assert error["message"] == "length_penalty must be a number from -1e+06 to 1e+06, got -inf"


def test_a_client_gone_mid_search_leaves_nothing_running(fp32_server):
    """The search stops with the client (a round's requests aborted, or no next round), so
    the engine makes no more tokens for it: far from its 4 x 400."""
    assert wait_until(lambda: engine_idle(fp32_server), 10)
    before = fp32_server.metric("vllm:generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fp32_server.url}/v1/completions", headers=fp32_server.headers, timeout=1.5,
                   json={"prompt": PROMPT, "n": 4, "max_tokens": 400, "ignore_eos": True,
                         "use_beam_search": True})
    counts = []  # the engine's token count a second apart, until it stops moving
    while len(counts) < 2 or counts[-1] != counts[-2] or not engine_idle(fp32_server):
        assert len(counts) < 15, f"the engine went on making tokens: {counts}"
        counts.append(fp32_server.metric("vllm:generation_tokens_total"))
        time.sleep(1.0)
    assert counts[-1] < before + 4 * 400


def test_a_search_refused_for_one_prompt_runs_none(fp32_server, monkeypatch):
    """The second prompt holds an id outside the vocabulary, found 0.5 s into its checks: a
    400, and the first prompt's search never started (it once ran its rounds meanwhile, until
    the request failed). A plain request of 3 prompt tokens and 1 output token after it moves
    the totals by its own counts alone."""
    start = fp32_server.engine.engine.start_beam_search

    def slow_to_refuse(prompt, params):
        if 10**8 in prompt:
            time.sleep(0.5)
        return start(prompt, params)

    monkeypatch.setattr(fp32_server.engine.engine, "start_beam_search", slow_to_refuse)

    def read() -> list[float]:
        return [fp32_server.metric("vllm:prompt_tokens_total"),
                fp32_server.metric("vllm:generation_tokens_total"), requests_finished(fp32_server)]

    before = read()
    r = httpx.post(f"{fp32_server.url}/v1/completions", headers=fp32_server.headers, timeout=60,
                   json={"prompt": [[504, 1834, 28, 638], [10**8]], "n": 2, "max_tokens": 50,
                         "ignore_eos": True, "use_beam_search": True})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"], r.text
    after = httpx.post(f"{fp32_server.url}/v1/completions", headers=fp32_server.headers, timeout=60,
                       json={"prompt": [2000, 2011, 2022], "max_tokens": 1, "ignore_eos": True})
    assert after.status_code == 200
    assert [a - b for a, b in zip(read(), before, strict=True)] == [3, 1, 1]

"""use_beam_search with the fields every request takes: cache_salt (a salted search is served
no other tenant's cached blocks, and usage reports the cached prompt tokens it was served),
truncate_prompt_tokens (the prompt's last k tokens, completions and chat), an empty prompt
refused as empty, and skip_special_tokens false for the beams' text."""

from __future__ import annotations

import uuid

import httpx
import pytest
from server_helpers import MODEL_NAME, tokenize

BEAMS = {"model": MODEL_NAME, "use_beam_search": True, "n": 2, "return_token_ids": True}
PROMPT = "Paris is nice. Rome is nice. The capital of France is"


def _post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", headers=server.headers, timeout=120, json=body)


def _ok(server, path: str, **body) -> dict:
    r = _post(server, path, **body)
    assert r.status_code == 200, r.text
    return r.json()


def _prompt_ids(reply: dict) -> list[int]:
    """The prompt's ids as vLLM returns them: in a completion's choice, beside a chat's."""
    return reply["prompt_token_ids"] if "prompt_token_ids" in reply else reply["choices"][0]["prompt_token_ids"]


def test_a_salted_search_is_served_only_its_own_salt_s_blocks(server):
    """40 prompt tokens hold 2 whole blocks of 16 (32 tokens) a later request can be served.
    A plain request caches them; a one-round search under a new salt is served none of them,
    and says so; the same search again is served its own 2 blocks, and reports 32."""
    prompt = list(range(2000, 2040))
    _ok(server, "completions", model=MODEL_NAME, prompt=prompt, max_tokens=1)
    search = {**BEAMS, "prompt": prompt, "max_tokens": 1, "cache_salt": f"tenant-{uuid.uuid4()}"}
    hits = server.metric("vllm:prefix_cache_hits_total")
    first = _ok(server, "completions", **search)
    assert server.metric("vllm:prefix_cache_hits_total") - hits == 0
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = _ok(server, "completions", **search)
    assert server.metric("vllm:prefix_cache_hits_total") - hits == 32
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_the_searched_prompt_is_its_last_tokens(server, path):
    """truncate_prompt_tokens 6: the search runs on the prompt's last 6 tokens (what /tokenize
    gives, cut by hand), its beams those of a search on them sent as the prompt."""
    asked = {"prompt": PROMPT} if path == "completions" else {
        "messages": [{"role": "user", "content": PROMPT}]}
    last_six = tokenize(server, **asked)[-6:]
    cut = _ok(server, path, **BEAMS, **asked, max_tokens=3, truncate_prompt_tokens=6)
    reference = _ok(server, "completions", **BEAMS, prompt=last_six, max_tokens=3)
    assert _prompt_ids(cut) == last_six and cut["usage"]["prompt_tokens"] == 6
    assert [c["token_ids"] for c in cut["choices"]] == [c["token_ids"] for c in reference["choices"]]


def test_a_prompt_over_the_context_is_searched_cut(server):
    long_prompt = "one two three " * 200  # 600 tokens, over the 512-token context
    assert _post(server, "completions", **BEAMS, prompt=long_prompt, max_tokens=2).status_code == 400
    cut = _ok(server, "completions", **BEAMS, prompt=long_prompt, max_tokens=2, truncate_prompt_tokens=8)
    assert _prompt_ids(cut) == tokenize(server, prompt=long_prompt)[-8:]


def test_an_empty_prompt_is_refused_as_without_beams(server):
    r = _post(server, "completions", **BEAMS, prompt="", max_tokens=3)
    assert r.status_code == 400 and r.json()["error"]["message"] == "the prompt is empty", r.text


def test_seed_minus_one_means_no_seed_and_is_taken_as_without_one(server):
    """vLLM reads seed -1 as no seed; beams sample nothing, so only a real seed is refused."""
    plain = _ok(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=3)
    unseeded = _ok(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=3, seed=-1)
    assert [c["text"] for c in unseeded["choices"]] == [c["text"] for c in plain["choices"]]
    r = _post(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=3, seed=7)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text


def test_echo_with_logprobs_is_refused_not_answered_without_the_prompts(server):
    """Beams compute no prompt logprobs: the echo's would be missing (vLLM asserts); echo
    alone, or logprobs alone, still works."""
    r = _post(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=2, echo=True, logprobs=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
    echoed = _ok(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=2, echo=True)
    assert echoed["choices"][0]["text"].startswith(PROMPT)
    assert _ok(server, "completions", **BEAMS, prompt=PROMPT, max_tokens=2, logprobs=1)["choices"][0]["logprobs"]


def test_skip_special_tokens_false_keeps_them_in_the_beams_text(server, hf_smollm_tokenizer):
    """Written past <|im_end|> (ignore_eos), each beam's text is transformers' decoding of its
    tokens: with the marks when skip_special_tokens is false, without them by default."""
    ask = {**BEAMS, "messages": [{"role": "user", "content": "What is 2+2? Answer with a number."}],
           "max_tokens": 12, "ignore_eos": True}
    kept = _ok(server, "chat/completions", **ask, skip_special_tokens=False)["choices"]
    skipped = _ok(server, "chat/completions", **ask)["choices"]
    assert any("<|im_end|>" in c["message"]["content"] for c in kept)  # the premise
    for with_marks, without in zip(kept, skipped, strict=True):
        ids = with_marks["token_ids"]
        assert without["token_ids"] == ids
        assert with_marks["message"]["content"] == hf_smollm_tokenizer.decode(ids, skip_special_tokens=False)
        assert without["message"]["content"] == hf_smollm_tokenizer.decode(ids, skip_special_tokens=True)

"""A server started with --speculative-config (n-gram drafts): the same answers as the plain
server, whole and streamed (a chunk may carry several tokens), and vLLM's spec_decode series
on /metrics. Both run fp32: bf16 drafts verified several rows at once need not give decode's
tokens (tests/engine_e2e/test_spec_decode.py runs those as decode rows)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import MODEL_NAME, VLLM_LABELS

PROMPT = ("Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew. "
          "Again: apple, banana,")
BODY = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 1}


def _stream(url: str) -> tuple[str, list[str], int]:
    """(text, token strings of the logprobs, the most tokens one chunk carried) of a stream."""
    text, tokens, most = "", [], 0
    with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                chunk_tokens = (choice.get("logprobs") or {}).get("tokens") or []
                tokens += chunk_tokens
                most = max(most, len(chunk_tokens))
    return text, tokens, most


def test_answers_equal_the_plain_servers_and_metrics_count_the_drafts(fp32_server, speculating):
    plain = httpx.post(f"{fp32_server.url}/v1/completions", json=BODY, headers=fp32_server.headers, timeout=60).json()
    spec = httpx.post(f"{speculating.url}/v1/completions", json=BODY, timeout=60).json()
    want = plain["choices"][0]
    got = spec["choices"][0]
    assert got["text"] == want["text"] and got["finish_reason"] == want["finish_reason"]
    assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
    assert got["logprobs"]["token_logprobs"] == pytest.approx(want["logprobs"]["token_logprobs"], abs=1e-4)
    assert spec["usage"] == plain["usage"]
    text, tokens, most = _stream(speculating.url)
    assert text == want["text"] and tokens == want["logprobs"]["tokens"]
    assert most > 1  # drafts kept: a step's chunk carried several tokens

    metrics = speculating.metrics()
    drafts = metrics[f'vllm:spec_decode_num_draft_tokens_total{{{VLLM_LABELS}}}']
    accepted = metrics[f'vllm:spec_decode_num_accepted_tokens_total{{{VLLM_LABELS}}}']
    first = metrics[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL_NAME}",position="0"}}']
    assert 0 < accepted <= drafts and 0 < first <= accepted
    assert metrics[f'vllm:generation_tokens_total{{{VLLM_LABELS}}}'] == 48  # two answers
    assert not any(name.startswith("vllm:spec_decode") for name in fp32_server.metrics())


@pytest.mark.parametrize("stop", [" date", "elder"])
def test_drafts_cut_by_a_stop_string_are_not_counted(speculating, stop):
    key = f'vllm:generation_tokens_total{{{VLLM_LABELS}}}'
    before = speculating.metrics()[key]
    out = httpx.post(f"{speculating.url}/v1/completions", json={**BODY, "stop": [stop]}, timeout=60).json()
    assert out["choices"][0]["finish_reason"] == "stop"
    assert speculating.metrics()[key] - before == out["usage"]["completion_tokens"]

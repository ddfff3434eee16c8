"""vllm:inter_token_latency_seconds as vLLM observes it: one sample per engine output that brings
tokens, after a request's first, of the time since the previous one (IterationStats.
update_from_output appends `engine_core_timestamp - last_token_ts` once an output, however
many tokens it carries). With speculative decoding an output carries several tokens; they
once gave one sample each, of the gap shared out among them. Either way the samples sum to the
time from the first token to the last (the decode time)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from server_helpers import MODEL_NAME, VLLM_LABELS, IdleEngine
from test_server_spec_decode import PROMPT

from inferlab.engine.outputs import CompletionOutput, RequestOutput
from inferlab.server import metrics as metrics_module
from inferlab.server.metrics import OutputObserver, ServerMetrics


def _samples(hist) -> dict[str, float]:
    return {s.name.removeprefix("vllm:inter_token_latency_seconds_") + s.labels.get("le", ""): s.value
            for family in hist.collect() for s in family.samples if not s.name.endswith("_created")}


def _output(total: int, delta: int) -> RequestOutput:
    completion = CompletionOutput(index=0, text="", token_ids=list(range(total)), finish_reason=None,
                                  token_ids_delta=list(range(total - delta, total)))
    return RequestOutput("r", None, [1, 2], [completion], False)


def test_an_output_of_several_tokens_is_one_gap(monkeypatch):
    """Outputs of 1, 3 and 2 tokens (drafts kept) reach the server at 10, 10.25 and 10.75 s,
    then one without tokens: vLLM's two gaps, 0.25 and 0.5 s, summing to the 0.75 s from the
    first token to the last (not five samples, three of 0.25 / 3 and two of 0.5 / 2)."""
    metrics = ServerMetrics(IdleEngine(), "m", lambda: 0)  # type: ignore[arg-type]
    clock = iter([10.0, 10.25, 10.75, 11.0])  # the server's clock as each output arrives
    monkeypatch.setattr(metrics_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    observer = OutputObserver(metrics)
    for total, delta in ((1, 1), (4, 3), (6, 2), (6, 0)):
        observer.output_arrived(0, _output(total, delta))
    seen = _samples(metrics.itl_s)
    assert (seen["count"], seen["sum"]) == (2, 0.75)
    assert (seen["bucket0.2"], seen["bucket0.3"], seen["bucket0.5"]) == (0, 1, 2)


def _read(server) -> dict[str, float]:
    m = server.metrics()
    label = f"{{{VLLM_LABELS}}}"
    return {key: m[f"vllm:{name}{label}"] for key, name in (
        ("itl_n", "inter_token_latency_seconds_count"), ("itl", "inter_token_latency_seconds_sum"),
        ("decode", "request_decode_time_seconds_sum"), ("tokens", "generation_tokens_total"))}


def test_a_speculating_server_observes_one_gap_per_streamed_output(speculating):
    """One streamed request alone: each engine output with tokens is one chunk of the stream
    (logprobs asked, so none is held back), so vLLM's count is the chunks less the first; the
    gaps sum to the request's decode time, up to the hand-over from the engine's thread."""
    before = _read(speculating)
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "logprobs": 1, "stream": True}
    per_chunk = []
    with httpx.stream("POST", f"{speculating.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                logprobs = json.loads(line[6:])["choices"][0].get("logprobs") or {}
                per_chunk.append(len(logprobs.get("tokens") or []))
    d = {key: value - before[key] for key, value in _read(speculating).items()}
    assert sum(per_chunk) == d["tokens"] == 24
    assert max(per_chunk) > 1  # drafts kept: the case where the two ways differ
    assert d["itl_n"] == sum(1 for n in per_chunk if n) - 1
    assert d["itl"] == pytest.approx(d["decode"], abs=0.1)

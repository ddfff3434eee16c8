"""A beam search's rounds in /metrics as vLLM counts them: its beam_search runs every round's
beams through generate(), each an engine request of n = 1 that its output processor records as
any other, in request_success_total and prompt_tokens_total and in every per-request
histogram. They once counted in the totals and in none of the histograms.

A beam search cancelled (its client gone) while a round's requests are in the engine's step:
the step still finishes them ("length", one token each), and they count in the per-request
histograms as they count in request_success_total, as vLLM's output processor records every
engine output as the engine makes it (IterationStats.update_from_output and
update_from_finished_request), read or not. They were once observed only as the search read
them, so the round whose outputs arrived after the cancel was left out of every histogram (a
gap of one beam width a cancelled search)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from server_helpers import MODEL_NAME, VLLM_LABELS, engine_idle, wait_until

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.engine_counters import EngineStats
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.generation import BeamGeneration
from inferlab.server.metrics import ServerMetrics
from tests.models.tiny_tokenizer import save_tiny_llama

_HISTOGRAMS = ["time_to_first_token_seconds", "e2e_request_latency_seconds",
               "request_queue_time_seconds", "request_prefill_time_seconds",
               "request_decode_time_seconds", "request_inference_time_seconds",
               "request_time_per_output_token_seconds", "request_prompt_tokens",
               "request_generation_tokens", "request_params_n",
               "request_max_num_generation_tokens"]


def _read(server) -> dict[str, float]:
    m = server.metrics()
    label = VLLM_LABELS
    values = {name: m[f"vllm:{name}_count{{{label}}}"] for name in _HISTOGRAMS}
    for name in ("request_prompt_tokens", "request_generation_tokens", "request_params_n"):
        values[name + "_sum"] = m[f"vllm:{name}_sum{{{label}}}"]
    values["success"] = m[f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL_NAME}"}}']
    values["prompt_total"] = m[f"vllm:prompt_tokens_total{{{label}}}"]
    return values


def test_every_round_of_a_beam_search_counts_as_a_request(server):
    """Width 2, 3 tokens, a prompt of P = 7 tokens, no end token taken. Round 1 runs the prompt
    alone, rounds 2 and 3 two beams each: 5 engine requests of one token each ("length"), of
    prompts P, P + 1, P + 1, P + 2, P + 2 (5P + 6 = 41 tokens). Each is one observation in
    every per-request histogram (n = 1 each)."""
    assert wait_until(lambda: engine_idle(server), 10)
    prompt = [2100 + 11 * i for i in range(7)]
    before = _read(server)
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 3, "n": 2,
                         "use_beam_search": True, "ignore_eos": True})
    assert r.status_code == 200, r.text
    d = {key: value - before[key] for key, value in _read(server).items()}
    assert (d["success"], d["prompt_total"]) == (5, 41)
    assert {name: d[name] for name in _HISTOGRAMS} == dict.fromkeys(_HISTOGRAMS, 5)
    assert (d["request_prompt_tokens_sum"], d["request_generation_tokens_sum"],
            d["request_params_n_sum"]) == (41, 5, 5)


WIDTH = 2  # the cancelled search's beam width


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """An engine of this module's own (not the session's `engine` the `server` runs on)."""
    engine = AsyncEngine.from_config(EngineConfig(
        model=save_tiny_llama(tmp_path_factory.mktemp("beam-cancel")), dtype="float32",
        kv_cache_memory_bytes=2**20))
    yield engine
    asyncio.run(engine.shutdown(timeout_s=0))


def _hold_the_second_round(engine: AsyncEngine) -> tuple[threading.Event, threading.Event]:
    """(held, release): once the first round's one step has run, the engine's next step waits
    for the second round's WIDTH requests (each added on its own) and then for `release`,
    after setting `held`."""
    held, release = threading.Event(), threading.Event()
    step = engine.engine.step
    steps = []

    def held_step(*args, **kwargs):
        if steps and not release.is_set():
            if engine.num_unfinished < WIDTH:
                return []  # a beam's add is still on its way: the loop drains it and comes back
            held.set()
            release.wait(30)
        steps.append(1)
        return step(*args, **kwargs)

    engine.engine.step = held_step
    return held, release


def _finished(now: EngineStats, before: EngineStats) -> int:
    """Requests ended by their length since `before`: vLLM's request_success_total."""
    return now.requests_finished.get("length", 0) - before.requests_finished.get("length", 0)


def _count_and_sum(hist) -> tuple[float, float]:
    seen = {s.name.rsplit("_", 1)[-1]: s.value for family in hist.collect()
            for s in family.samples if not s.name.endswith(("_bucket", "_created"))}
    return seen["count"], seen["sum"]


def test_a_round_finished_after_the_cancel_counts_in_the_histograms(tiny_engine):
    """Round 1 runs the prompt alone, round 2 its WIDTH = 2 beams; the search is cancelled
    while round 2 is in the step, which then ends both of its requests. By request_success
    and prompt_tokens (the engine's own counts): 3 finished requests, each one observation in
    the finished-request histograms, their prompt lengths summing to the engine's prompt
    tokens."""
    engine = tiny_engine
    metrics = ServerMetrics(engine, "m", lambda: 0)
    held, release = _hold_the_second_round(engine)
    before = engine.stats()

    async def run() -> None:
        gen = BeamGeneration(engine, ["w2 w3 w4"], SamplingParams(n=WIDTH, max_tokens=5), "beam",
                             metrics, on_close=lambda: None,
                             beam=BeamSearchParams(beam_width=WIDTH, max_tokens=5, ignore_eos=True))
        start = asyncio.create_task(gen.start())
        assert await asyncio.to_thread(held.wait, 30)
        start.cancel()  # the client went away: the server closes the generation
        await gen.close()
        release.set()  # the held step ends both requests; the aborts after it find nothing
        deadline = time.monotonic() + 10
        while _finished(engine.stats(), before) < 1 + WIDTH and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the step's outputs, sent after its stats, reach this loop

    asyncio.run(run())
    after = engine.stats()
    finished = _finished(after, before)
    assert finished == 1 + WIDTH and engine.num_unfinished == 0
    assert after.requests_finished.get("abort", 0) == before.requests_finished.get("abort", 0)
    for hist in (metrics.e2e_s, metrics.queue_s, metrics.decode_s, metrics.tpot_s,
                 metrics.output_len):
        assert _count_and_sum(hist)[0] == finished, hist
    assert _count_and_sum(metrics.output_len)[1] == finished  # one token each
    assert _count_and_sum(metrics.prompt_len) == (
        finished, after.prompt_tokens_total - before.prompt_tokens_total)

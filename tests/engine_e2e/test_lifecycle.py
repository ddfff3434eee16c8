"""Aborts free every block; requests carry their timestamps; impossible requests fail at once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.outputs import RequestMetrics, RequestOutput
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError


def test_abort_mid_generation_returns_every_block(make_llm):
    engine = make_llm().engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    ids = [engine.add_request("word " * (10 + 7 * i), params) for i in range(3)]
    for _ in range(4):
        engine.step()
    assert engine.scheduler.stats().num_free_blocks < engine.num_kv_blocks
    out = engine.abort_request(ids[1])
    assert out.finished and out.outputs[0].finish_reason == "abort"
    for request_id in (ids[0], ids[2]):
        engine.abort_request(request_id)
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.stats().num_free_blocks == engine.num_kv_blocks


def test_final_only_steps_give_the_same_final_outputs(make_llm):
    """LLM.generate steps with final_only (no per-step outputs); its results must equal the
    finished outputs of ordinary steps: text, tokens, finish reasons, stop strings, logprobs, n."""
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, seed=3, max_tokens=20, n=2, stop=[" the"]),
              SamplingParams(temperature=0, max_tokens=9, stop=["5"])]
    final = make_llm().generate(prompts, params)
    engine = make_llm().engine
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    stepped = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                stepped[out.request_id] = out
    for got, want in zip(final, (stepped[i] for i in ids), strict=True):
        assert [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in got.outputs] == \
            [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in want.outputs]
        assert [c.logprobs for c in got.outputs] == [c.logprobs for c in want.outputs]
    assert final[2].outputs[0].finish_reason == "stop"


def test_timestamps_in_order(make_llm):
    out = make_llm().generate(["Hello there"], SamplingParams(temperature=0, max_tokens=5,
                                                                ignore_eos=True))[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time
    assert m.last_token_time <= m.finished_time
    assert m.num_generation_tokens == 5 and m.mean_tpot_s > 0


def test_time_per_output_token_of_n_completions_is_per_completion(make_llm):
    out = make_llm().generate(["Hello there"], SamplingParams(n=3, temperature=1, seed=0,
                                                                max_tokens=5, ignore_eos=True))[0]
    assert (out.metrics.num_generation_tokens, out.metrics.longest_completion_tokens) == (15, 5)
    # three completions decoding 0.4 s side by side: 0.1 s a token each, not 0.4 / 14
    side_by_side = RequestMetrics(arrival_time=0.0, first_token_time=1.0, last_token_time=1.4,
                                  num_generation_tokens=15, longest_completion_tokens=5)
    assert side_by_side.mean_tpot_s == pytest.approx(0.1)


def test_requests_that_can_never_fit_are_rejected(make_llm):
    llm = make_llm(max_model_len=64)
    with pytest.raises(InferlabError, match="the prompt has 64 tokens, the context holds 64"):
        llm.generate([list(range(1, 65))], SamplingParams(max_tokens=1))  # max_tokens past it: capped
    with pytest.raises(InferlabError, match="outside the vocabulary"):
        llm.generate([[1, 2, 99999]], SamplingParams(max_tokens=1))
    with pytest.raises(InferlabError, match="must be integers"):
        llm.generate([[1, 2.5]], SamplingParams(max_tokens=1))
    for wrong in (None, 5):  # once a TypeError from inside generate
        with pytest.raises(InferlabError, match="prompts must be a str"):
            llm.generate(wrong, SamplingParams(max_tokens=1))
    tiny = make_llm(kv_cache_memory=2 * 16 * 46080)  # two blocks
    with pytest.raises(InferlabError):
        tiny.generate([list(range(1, 40))], SamplingParams(max_tokens=2))
    assert not tiny.engine.has_unfinished_requests()


def test_a_refused_prompt_leaves_nothing_queued(make_llm):
    llm = make_llm(max_model_len=64)
    free = llm.engine.scheduler.stats().num_free_blocks
    with pytest.raises(InferlabError, match="no room for output"):
        llm.generate([[1, 2, 3], list(range(1, 65))], SamplingParams(max_tokens=4))
    # the first prompt was accepted before the second was refused: it must not run later
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.stats().num_free_blocks == free
    assert [o.prompt_token_ids for o in llm.generate([[7, 8]], SamplingParams(max_tokens=2))] == [[7, 8]]


def test_a_kv_cache_larger_than_the_free_memory_is_refused(make_llm, monkeypatch):
    import inferlab.engine.llm_engine as llm_engine

    # 1 TiB once went to torch.zeros and ended in the OOM killer (exit 137), not in an error;
    # 64 MiB holds 91 whole 16-token blocks at 46,080 bytes a token: 63.98 MiB
    monkeypatch.setattr(llm_engine, "available_memory_bytes", lambda device: 32 * 2**20)
    with pytest.raises(InferlabError, match=r"63.98 MiB .* does not fit in the 32.00 MiB"):
        make_llm(kv_cache_memory="64MiB")
    assert make_llm(kv_cache_memory="16MiB").num_kv_blocks > 0


def test_a_copys_id_taken_by_another_request_is_refused_with_nothing_queued(make_llm):
    """n = 2 under "z" makes copies "z#0" and "z#1"; a running request of its own named "z#1"
    once let "z#0" be queued before the clash was found, and the next step failed on it (an
    AsyncEngine's loop died for every request)."""
    engine = make_llm().engine
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3), request_id="z#1")
    with pytest.raises(InferlabError, match="request id 'z#1' is already in use"):
        engine.add_request([4, 5], SamplingParams(n=2, max_tokens=2), request_id="z")
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert list(done) == ["z#1"] and len(done["z#1"].outputs[0].token_ids) == 3



def test_a_generate_cancelled_before_its_add_leaves_the_ids_holder_running(make_llm, monkeypatch):
    """A second generate() under a request id in use, cancelled while its prompt was being
    encoded, once aborted the first request: its abort went by the id alone."""
    engine = AsyncEngine(make_llm().engine)
    encoded = threading.Event()
    encode = engine.engine.tokenize_prompt

    async def run() -> RequestOutput:
        holder = engine.generate("Hello", SamplingParams(max_tokens=12, ignore_eos=True), "dup")
        first = await anext(holder)
        monkeypatch.setattr(engine.engine, "tokenize_prompt",
                            lambda *args: encoded.wait(30) and encode(*args))
        second = asyncio.ensure_future(anext(engine.generate("Hi", SamplingParams(max_tokens=2), "dup")))
        await asyncio.sleep(0.2)  # the second is encoding its prompt
        second.cancel()
        encoded.set()
        outputs = [first] + [out async for out in holder]
        await engine.shutdown(timeout_s=10)
        return outputs[-1]

    last = asyncio.run(run())
    assert last.outputs[0].finish_reason == "length" and len(last.outputs[0].token_ids) == 12


def test_an_idle_step_forgets_a_finished_seeded_request(make_llm):
    """A request's id reused with its seed draws its tokens again. An idle step once took the
    finished ids without handing them to the runner, whose seeded draws for the first "x" then
    went on for the second (the reference: a fresh id with the same seed)."""
    engine = make_llm().engine
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=8)

    def run(request_id: str) -> list[int]:
        engine.add_request("The capital of France is", params, request_id=request_id)
        final = [o for _ in iter(engine.has_unfinished_requests, False) for o in engine.step()
                 if o.finished]
        engine.step()  # idle: a serving loop may step once more
        return final[0].outputs[0].token_ids

    first = run("x")
    assert run("x") == first == run("y")

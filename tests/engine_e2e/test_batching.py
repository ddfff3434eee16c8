"""Continuous batching, chunked prefill, preemption and prefix caching never change the tokens."""

from __future__ import annotations

import argparse
import random

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, InvalidParameterError
from tests.markers import bf16_kernels


def _prompts(llm, text: str, count: int, min_len: int, max_len: int) -> list[list[int]]:
    ids = llm.tokenizer.encode(text[:200_000])
    prompts, start = [], 0
    for i in range(count):
        n = min_len + (i * 37) % (max_len - min_len)
        prompts.append(ids[start:start + n])
        start += n
    return prompts


def assert_as_unconstrained(roomy: LLM, prompts: list[list[int]], params: SamplingParams,
                            outputs: list) -> None:
    """`outputs` hold the tokens the prompts get from an engine with room for all of them at
    once (no preemption, the default step budget), and every fourth the tokens it gets alone."""
    reference = roomy.generate(prompts, params)
    assert roomy.engine.scheduler.stats().num_preemptions_total == 0
    for i, (prompt, out, want) in enumerate(zip(prompts, outputs, reference, strict=True)):
        assert out.outputs[0].token_ids == want.outputs[0].token_ids
        if i % 4 == 0:
            assert out.outputs[0].token_ids == roomy.generate([prompt], params)[0].outputs[0].token_ids


def watch_chunks(llm: LLM, keep) -> list:
    """The scheduled chunks `keep` accepts, from every step `llm` runs after this call."""
    schedule, kept = llm.engine.scheduler.schedule, []

    def watched_schedule():
        out = schedule()
        kept.extend(c for c in out.chunks if keep(c))
        return out

    llm.engine.scheduler.schedule = watched_schedule
    return kept


def test_batch_invariance_under_chunking_and_preemption(make_llm, wiki_text):
    # 24 blocks of 16 tokens cannot hold 32 requests of 20-60 tokens: preemption must happen
    small = make_llm(kv_cache_memory=24 * 16 * 46080, max_num_batched_tokens=64)
    roomy = make_llm(kv_cache_memory="256MiB")
    prompts = _prompts(small, wiki_text, 32, 20, 60)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    partial_prefills = watch_chunks(small, lambda c: c.num_computed_tokens == 0
                                    and c.num_new_tokens < c.request.num_prompt_tokens)
    together = small.generate(prompts, params)
    stats = small.engine.scheduler.stats()
    assert stats.num_preemptions_total > 0
    assert partial_prefills  # some prompt's first chunk stopped short of its end
    assert stats.num_free_blocks == small.num_kv_blocks
    assert_as_unconstrained(roomy, prompts, params, together)


def test_capped_long_prefills_keep_the_tokens(make_llm, wiki_text):
    """long_prefill_token_threshold 24: prompts of 20-90 tokens go in chunks of at most 24, beside
    each other, and every request gets the tokens it gets uncapped."""
    capped = make_llm(kv_cache_memory="256MiB", long_prefill_token_threshold=24)
    roomy = make_llm(kv_cache_memory="256MiB")
    prompts = _prompts(capped, wiki_text, 8, 20, 90)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt_chunks = watch_chunks(capped, lambda c: c.num_computed_tokens < c.request.num_prompt_tokens)
    together = capped.generate(prompts, params)
    assert max(c.num_new_tokens for c in prompt_chunks) == 24 and max(len(p) for p in prompts) > 24
    assert_as_unconstrained(roomy, prompts, params, together)


def test_without_chunked_prefill_each_prompt_is_computed_in_one_step(make_llm, wiki_text):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = engine_config_from_args(parser.parse_args(["--no-enable-chunked-prefill"]))
    assert not flags.enable_chunked_prefill and flags.max_num_batched_tokens is None
    auto = make_llm(enable_chunked_prefill=False, kv_cache_memory="256MiB")  # 5,824 fp32 tokens
    # no budget given: a step holds the whole context, as vLLM sizes it
    assert auto.engine.scheduler.config.max_num_batched_tokens == auto.engine.max_model_len == 5824
    with pytest.raises(InferlabError, match=r"without chunked prefill max_num_batched_tokens \(2048\) "
                                            r"must be at least max_model_len \(4096\)"):
        EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=4096)
    # a step takes at most two of the 40-100-token prompts; 24 blocks hold them all only in turns
    whole = make_llm(enable_chunked_prefill=False, max_model_len=200, max_num_batched_tokens=200,
                     kv_cache_memory=24 * 16 * 46080)
    prompts = _prompts(whole, wiki_text, 12, 40, 100)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    schedule, cut = whole.engine.scheduler.schedule, []

    def watched_schedule():
        out = schedule()
        cut.extend(c for c in out.chunks if not c.samples)  # a prompt computed only in part
        return out

    whole.engine.scheduler.schedule = watched_schedule
    outputs = whole.generate(prompts, params)
    assert not cut and whole.engine.scheduler.stats().num_preemptions_total > 0
    assert_as_unconstrained(make_llm(kv_cache_memory="256MiB"), prompts, params, outputs)


def test_prefix_cache_on_and_off_agree(make_llm, wiki_text):
    shared = _prompts(make_llm(), wiki_text, 1, 200, 201)[0]
    prompts = [shared + [100 + i, 200 + i] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    on = make_llm(enable_prefix_caching=True).generate(prompts, params)
    off = make_llm(enable_prefix_caching=False).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off]
    assert all(o.num_cached_tokens == 0 for o in off)
    assert all(o.num_cached_tokens == 192 for o in on[1:])  # 12 full blocks of the 200 shared


@pytest.mark.slow
def test_prefix_cache_serves_a_shared_512_token_prefix(make_llm, wiki_text):
    llm = make_llm(kv_cache_memory="256MiB")
    prefix = _prompts(llm, wiki_text, 1, 512, 513)[0]
    prompts = [prefix + llm.tokenizer.encode(f" Question {i}: why?") for i in range(32)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    stats = llm.engine.scheduler.stats()
    shareable = 31 * 512
    assert stats.prefix_cache_hit_tokens >= 0.9 * shareable


def test_priority_scheduling_preempts_by_priority_and_keeps_the_tokens(make_llm, wiki_text):
    small = make_llm(kv_cache_memory=12 * 16 * 46080, max_num_batched_tokens=64,
                     scheduling_policy="priority")
    roomy = make_llm(kv_cache_memory="256MiB")
    prompts = _prompts(small, wiki_text, 12, 20, 60)
    priorities = [(i * 7) % 3 for i in range(len(prompts))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    finished_order: list[str] = []
    step = small.engine.step

    def watched_step(final_only: bool = False):
        outputs = step(final_only)
        finished_order.extend(o.request_id for o in outputs if o.finished)
        return outputs

    small.engine.step = watched_step
    together = small.generate(prompts, params, priority=priorities)
    assert small.engine.scheduler.stats().num_preemptions_total > 0
    assert small.engine.scheduler.stats().num_free_blocks == small.num_kv_blocks
    assert_as_unconstrained(roomy, prompts, params, together)
    # the queue is long (12 requests, room for a few): priority 0 all finish before priority 2
    rank = {out.request_id: p for out, p in zip(together, priorities, strict=True)}
    done = [rank[i] for i in finished_order]
    assert max(i for i, p in enumerate(done) if p == 0) < min(i for i, p in enumerate(done) if p == 2)


def test_priority_needs_the_priority_policy(make_llm):
    llm = make_llm()
    with pytest.raises(InvalidParameterError, match="--scheduling-policy priority"):
        llm.generate("Hello", SamplingParams(max_tokens=2), priority=[1])
    with pytest.raises(InferlabError, match="2 prompts but 1 priorities"):
        llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[0])
    with pytest.raises(InferlabError, match="2 prompts but 0 sampling params"):  # once the defaults
        llm.generate(["a", "b"], [])
    assert not llm.engine.has_unfinished_requests()


@bf16_kernels
def test_seeded_bf16_sampling_and_logprobs_ignore_the_batch():
    """bf16, the default dtype on a CPU with AVX512-BF16: the same request alone and beside copies of itself
    and other prompts (decode batches of 1 and of 6, prefills of 4 and of ~20 rows) samples the
    same tokens with the same logprobs, bit for bit."""
    llm = LLM(dtype="bfloat16", kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True, logprobs=0)
    alone = llm.generate(["Tell me a story"], params)[0].outputs[0]
    batch = llm.generate(["Tell me a story", "Why", "Tell me a story", "A long time ago", "B", "C"],
                         [params, SamplingParams(temperature=1.0, max_tokens=9), params,
                          SamplingParams(temperature=0.5, max_tokens=12), params, params])
    for out in (batch[0].outputs[0], batch[2].outputs[0]):
        assert out.token_ids == alone.token_ids
        assert [e.logprob for e in out.logprobs] == [e.logprob for e in alone.logprobs]


@bf16_kernels
def test_seeded_bf16_sampling_ignores_where_the_prompt_is_cut():
    """bf16: a prompt prefilled whole, in chunks of 7, and in one of 60 tokens whose last token
    then runs alone as a decode-shaped step (what a busy batch's token budget does to it):
    the same sampled tokens and logprobs, bit for bit. Before the prefill attention summed its
    scores as the decode kernel does, the last cut moved this prompt's first logprob from
    -4.64 to -4.69."""
    whole = LLM(dtype="bfloat16", kv_cache_memory="64MiB")
    gen = random.Random(1)
    prompt = [gen.randrange(100, 40000) for _ in range(61)]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, logprobs=0)
    expected = whole.generate([prompt], params)[0].outputs[0]
    for step in (7, 60):
        cut = LLM(loaded=whole.engine.loaded, dtype="bfloat16", kv_cache_memory="64MiB",
                  max_num_batched_tokens=step, max_num_seqs=step).generate([prompt], params)[0].outputs[0]
        assert cut.token_ids == expected.token_ids, step
        assert [e.logprob for e in cut.logprobs] == [e.logprob for e in expected.logprobs], step

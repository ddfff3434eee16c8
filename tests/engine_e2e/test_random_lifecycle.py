"""Random adds, aborts and steps on a KV cache small enough to preempt often, with n > 1, seeds,
stop strings, logprobs, logit biases, allowed and bad words, guided choices, JSON objects and
JSON schemas, truncated prompts,
cache salts and shared prefixes mixed, under either scheduling policy (priorities drawn at
random; the priority run with speculative n-gram drafts too): whatever the order, every request ends with a valid reason and a length within its
bounds, and nothing is left behind (blocks, requests, output state)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.sampling_params import SamplingParams

SHARED_PREFIX = [5, 6, 7, 8] * 10


CHOICES = ["yes", "no", "no idea at all", "maybe"]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", 0, 10]},
                                           "why": {"type": "array", "items": {"type": "string"}}},
          "required": ["answer"]}


def _random_params(rng: random.Random) -> SamplingParams:
    roll = rng.random()
    if roll < 0.2:  # guided decoding, which excludes the other ways to bar tokens
        json_object, json_schema = roll < 0.04, SCHEMA if 0.04 <= roll < 0.08 else None
        to_json = json_object or json_schema is not None
        return SamplingParams(n=rng.choice([1, 2]), max_tokens=rng.randrange(1, 30 if to_json else 8),
                              temperature=rng.choice([0.0, 1.0]),
                              guided_choice=None if to_json else CHOICES, json_object=json_object,
                              json_schema=json_schema, seed=rng.choice([None, rng.randrange(10**6)]))
    return SamplingParams(n=rng.choice([1, 1, 2, 3]), max_tokens=rng.randrange(1, 40),
                          temperature=rng.choice([0.0, 0.8]),
                          seed=rng.choice([None, rng.randrange(10**6)]),
                          stop=rng.choice([[], ["the"], [" a", "."]]),
                          logprobs=rng.choice([None, 2]), ignore_eos=rng.random() < 0.5,
                          include_stop_str_in_output=rng.random() < 0.3,
                          logit_bias=rng.choice([None, {rng.randrange(49152): rng.uniform(-100, 100)}]),
                          allowed_token_ids=rng.choice([None, None, list(range(200, 230))]),
                          bad_words=rng.choice([[], ["the"], ["of the", "and"]]),
                          truncate_prompt_tokens=rng.choice([None, None, 20]),
                          cache_salt=rng.choice([None, None, "tenant"]))


def _prompt(rng: random.Random) -> list[int]:
    own = [rng.randrange(100, 40000) for _ in range(rng.randrange(1, 90))]
    return SHARED_PREFIX + own[:30] if rng.random() < 0.3 else own


@pytest.mark.parametrize(("policy", "speculative"), [
    ("fcfs", None), ("priority", {"num_speculative_tokens": 3, "prompt_lookup_max": 2})])
def test_random_adds_aborts_and_preemptions_leave_nothing_behind(make_fast_llm, policy, speculative):
    bytes_per_token = make_fast_llm().engine.kv_bytes_per_token
    llm = make_fast_llm(kv_cache_memory=16 * 16 * bytes_per_token, max_model_len=200,
                   max_num_seqs=8, max_num_batched_tokens=64, scheduling_policy=policy,
                   speculative_config=speculative)
    engine = llm.engine
    blocks = engine.scheduler.stats().num_free_blocks
    rng = random.Random(0)
    params, live, finished = {}, set(), {}

    def collect(outputs) -> None:
        for out in outputs:
            if out.finished:
                finished[out.request_id] = out
                live.discard(out.request_id)

    for _ in range(150):
        roll = rng.random()
        if roll < 0.3:
            p = _random_params(rng)
            priority = rng.randrange(3) if policy == "priority" else 0
            request_id = engine.add_request(_prompt(rng), p, priority=priority)
            params[request_id] = p
            live.add(request_id)
        elif roll < 0.38 and live:
            request_id = rng.choice(sorted(live))
            collect([engine.abort_request(request_id)])
        else:
            collect(engine.step())
    while engine.has_unfinished_requests():
        collect(engine.step())

    stats = engine.scheduler.stats()
    assert stats.num_preemptions_total > 0  # the cache was small enough to matter
    if speculative:
        assert engine.spec_counters.num_accepted_tokens > 0
    assert stats.num_free_blocks == blocks and not live and not engine.outputs.parents
    assert set(finished) == set(params)
    for request_id, out in finished.items():
        p = params[request_id]
        assert len(out.outputs) == p.n
        for c in out.outputs:
            assert c.finish_reason in ("stop", "length", "abort")
            assert len(c.token_ids) <= p.max_tokens
            if c.finish_reason == "length":
                assert len(c.token_ids) == p.max_tokens
            if p.logprobs is not None and c.finish_reason != "abort":
                assert len(c.logprobs) == len(c.token_ids)
            if p.allowed_token_ids is not None:
                assert set(c.token_ids) <= set(p.allowed_token_ids)
            if p.guided_choice and c.finish_reason == "stop":
                assert c.text in p.guided_choice
            elif p.guided_choice:
                assert any(choice.startswith(c.text) for choice in p.guided_choice)
            if p.guided_schema is not None and c.finish_reason == "stop":
                jsonschema.validate(json.loads(c.text), p.guided_schema)
                assert p.json_schema or isinstance(json.loads(c.text), dict)
            elif p.guided_schema is not None:
                grammar = JsonGrammar(p.guided_schema)
                assert grammar.advance(grammar.start, c.text) is not None

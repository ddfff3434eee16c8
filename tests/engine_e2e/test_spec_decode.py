"""Speculative decoding (n-gram drafts) on the embedded model: the same tokens as without it,
greedy (and as transformers' generate) and seeded sampling alike, while drafts are both kept
and rejected."""

from __future__ import annotations

import pytest
import torch

from inferlab.engine.sampling_params import SamplingParams
from inferlab.kernels import cpu_ops

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = [
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew. "
    "Again: apple, banana,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "one two three four one two three four one two",
    "The history of the city begins with",
]


@pytest.fixture(scope="module")
def plain(make_llm):
    return make_llm()


@pytest.fixture(scope="module")
def speculating(make_llm):
    return make_llm(speculative_config=NGRAM)


def _tokens(outputs):
    return [[c.token_ids for c in out.outputs] for out in outputs]


def test_greedy_tokens_equal_plain_decoding_and_transformers(plain, speculating, hf_smollm):
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    before = speculating.engine.spec_counters.num_accepted_tokens
    spec = speculating.generate(PROMPTS, params)
    assert _tokens(spec) == _tokens(plain.generate(PROMPTS, params))
    for prompt, out in zip(PROMPTS[:2], spec[:2], strict=True):  # plain == transformers: tested elsewhere
        ids = plain.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = hf_smollm.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          do_sample=False, max_new_tokens=32, min_new_tokens=32)
        assert out.outputs[0].token_ids == expected[0, len(ids):].tolist(), prompt
    counters = speculating.engine.spec_counters
    accepted = counters.num_accepted_tokens - before
    assert 0 < accepted < counters.num_draft_tokens  # the premise: drafts were kept and rejected
    assert counters.accepted_per_position[0] >= counters.accepted_per_position[-1]


def test_seeded_sampling_gives_the_same_tokens_with_drafts(plain, speculating):
    """The m-th output token is drawn with the seed's m-th number, whatever a step keeps:
    with penalties, top-p, min_tokens and logprobs, the same tokens and logprobs."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=32, logprobs=2),
              SamplingParams(temperature=1.0, top_k=20, seed=11, max_tokens=32, frequency_penalty=0.4,
                             presence_penalty=0.2, repetition_penalty=1.1, min_tokens=20),
              SamplingParams(temperature=0.5, seed=3, max_tokens=32, min_p=0.1),
              SamplingParams(temperature=0, max_tokens=32, logprobs=1)]
    before = speculating.engine.spec_counters.num_accepted_tokens
    spec = speculating.generate(PROMPTS, params)
    base = plain.generate(PROMPTS, params)
    assert _tokens(spec) == _tokens(base)
    assert speculating.engine.spec_counters.num_accepted_tokens > before
    for s, b in zip(spec, base, strict=True):
        assert [c.text for c in s.outputs] == [c.text for c in b.outputs]
        if b.outputs[0].logprobs is not None:
            got, want = s.outputs[0].logprobs, b.outputs[0].logprobs
            assert [lp.token_id for lp in got] == [lp.token_id for lp in want]
            assert [lp.logprob for lp in got] == pytest.approx([lp.logprob for lp in want], abs=1e-4)
            assert [[t for t, _ in lp.top] for lp in got] == [[t for t, _ in lp.top] for lp in want]


@pytest.mark.parametrize("stop", [" fig", "grape"])
def test_a_stop_string_inside_kept_drafts_ends_the_output_at_its_token(plain, speculating, stop):
    """Here the token that completes the stop string is kept in the same step as drafts after
    it: those are cut, from the token ids and the logprobs."""
    params = SamplingParams(temperature=0, max_tokens=40, stop=[stop], logprobs=1)
    spec, base = speculating.generate(PROMPTS[0], params)[0], plain.generate(PROMPTS[0], params)[0]
    assert base.outputs[0].finish_reason == "stop" and base.outputs[0].stop_reason == stop
    for field in ("text", "token_ids", "finish_reason", "stop_reason"):
        assert getattr(spec.outputs[0], field) == getattr(base.outputs[0], field), field
    assert len(spec.outputs[0].logprobs) == len(spec.outputs[0].token_ids)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=32, frequency_penalty=0.3, repetition_penalty=1.05),
    SamplingParams(temperature=0, max_tokens=24, bad_words=["date, elderberry"]),
], ids=["penalties", "bad_words"])
def test_a_draft_position_sees_the_drafts_before_it_as_output(plain, speculating, params):
    """Penalties and bad words at a draft position count the drafts before it (greedy, so any
    miscount that moves an argmax shows: here both do without it)."""
    before = speculating.engine.spec_counters.num_accepted_tokens
    assert _tokens(speculating.generate(PROMPTS, params)) == _tokens(plain.generate(PROMPTS, params))
    assert speculating.engine.spec_counters.num_accepted_tokens > before


def test_preemption_and_a_small_cache_change_nothing(make_llm, plain):
    """Drafts take slots: with 16 requests in a cache of 24 blocks, requests are preempted and
    recomputed, and each still gives its greedy tokens alone."""
    small = make_llm(speculative_config=NGRAM, kv_cache_memory=24 * 16 * 30 * 2 * 3 * 64 * 4,
                     max_num_batched_tokens=64)
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(16)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got = small.generate(prompts, params)
    assert small.engine.scheduler.num_preemptions_total > 0  # the premise
    assert small.engine.spec_counters.num_accepted_tokens > 0
    assert _tokens(got) == _tokens(plain.generate(prompts, params))
    assert small.engine.scheduler.block_manager.usage == 0


GUIDED_PROMPT = ('Copy this JSON exactly: {"name": "Rex", "age": 4, "colors": ["black", "white"], '
                 '"indoor": true}\nCopy: ')
# the n-grams after '"name": "' propose the later "Max": drafts the guide must not keep reading
TWO_PROMPT = 'Copy the first JSON: {"name": "Rex", "age": 4} then {"name": "Max", "age": 7}\nFirst: '
PET = {"type": "object", "properties": {"name": {"enum": ["Rex", "Max"]}, "age": {"type": "integer"}},
       "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize(("guide", "prompt"), [
    ({"json_object": True}, GUIDED_PROMPT),
    ({"json_schema": PET}, TWO_PROMPT),
    ({"guided_regex": r'\{"name": "(Rex|Max)", "age": [0-9]\}'}, TWO_PROMPT),
    ({"guided_choice": ['{"name": "Rex", "age": 4}', '{"name": "Rex", "age": 5}']}, GUIDED_PROMPT),
], ids=["json_object", "json_schema", "regex", "choice"])
def test_guided_requests_draft_within_their_guide(plain, speculating, guide, prompt):
    """A draft position's allowed tokens are the guide's as if the drafts before it were kept,
    without moving the guide: the same guided tokens as without drafts, drafts kept."""
    params = SamplingParams(temperature=0, max_tokens=40, **guide)
    before = speculating.engine.spec_counters.num_accepted_tokens
    spec = speculating.generate(prompt, params)[0].outputs[0]
    base = plain.generate(prompt, params)[0].outputs[0]
    assert (spec.token_ids, spec.text, spec.finish_reason) == (base.token_ids, base.text, base.finish_reason)
    assert spec.text.startswith('{"name": "Rex"')
    assert speculating.engine.spec_counters.num_accepted_tokens > before


def test_a_grammar_guide_looks_past_drafts_without_moving(plain):
    """allowed_now(output, drafts) is what a guide that read output + drafts allows, and leaves
    the guide where the output alone puts it."""
    engine = plain.engine
    params = SamplingParams(temperature=0, max_tokens=8, json_object=True)
    ids = engine.tokenizer.encode('{"name": "Rex", "age"', add_special_tokens=False)
    output, drafts = ids[:2], ids[2:6]
    looking = engine.requests.guide(params, [])
    for j in range(len(drafts) + 1):
        fresh = engine.requests.guide(params, [])
        assert torch.equal(looking.allowed_now(output, drafts[:j]), fresh.allowed_now(output + drafts[:j]))
    fresh = engine.requests.guide(params, [])
    assert torch.equal(looking.allowed_now(output), fresh.allowed_now(output))
    assert torch.equal(looking.allowed_now(output + [ids[2]]), fresh.allowed_now(output + [ids[2]]))


@pytest.mark.skipif(not cpu_ops.model_forward_available(),
                    reason="no one-call C forward on this CPU (it needs AVX512-BF16)")
def test_bf16_drafts_verified_as_decode_rows_give_the_plain_tokens(monkeypatch):
    """In bf16 on this CPU, a chunk with drafts runs as decode rows through the one-call C path,
    as plain decode steps do: the same greedy tokens, and every decode step in C."""
    from inferlab.engine.llm import LLM
    from inferlab.kernels import cpu_model

    plain = LLM(dtype="bfloat16", kv_cache_memory="64MiB")
    speculating = LLM(loaded=plain.engine.loaded, dtype="bfloat16", kv_cache_memory="64MiB",
                      speculative_config=NGRAM)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    expected = _tokens(plain.generate(PROMPTS, params))
    in_c = []  # per forward after the prompts': whether the C path took it
    run_model = cpu_model.run_model

    def recording(model, input_ids, rope, kv_caches, meta):
        hidden = run_model(model, input_ids, rope, kv_caches, meta)
        if meta.seq_lens_cpu[0] > len(plain.tokenizer.encode(PROMPTS[0])):
            in_c.append(hidden is not None)
        return hidden

    monkeypatch.setattr(cpu_model, "run_model", recording)
    assert _tokens(speculating.generate(PROMPTS[0], params)) == expected[:1]
    assert speculating.engine.spec_counters.num_accepted_tokens > 0
    assert in_c and all(in_c)


@pytest.mark.parametrize("by_batch_size", [
    {"disable_by_batch_size": 2},
    {"num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 64, 0]]},
], ids=["disable_by_batch_size", "per_batch_size"])
def test_no_drafts_while_more_requests_than_the_config_allows_run(make_llm, plain, by_batch_size):
    llm = make_llm(speculative_config={**NGRAM, **by_batch_size})
    steps = []  # (sequences in the step, whether any had drafts)
    execute = llm.engine.runner.execute

    def recording(sched):
        steps.append((len(sched.chunks), any(c.spec_token_ids for c in sched.chunks)))
        return execute(sched)

    llm.engine.runner.execute = recording
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (6, 24, 24)]
    got = llm.generate(PROMPTS[:3], params)
    assert _tokens(got) == _tokens(plain.generate(PROMPTS[:3], params))
    assert not any(drafted for size, drafted in steps if size == 3)
    assert any(drafted for size, drafted in steps if size <= 2)  # once the first finished


def test_the_graph_path_runs_drafts_as_decode_rows(make_llm, plain):
    """The CUDA-graph decode path (its buffers and padding, run eagerly on CPU) takes a step with
    drafts as one row per token: the same tokens, in batches larger than the sequences."""
    from .conftest import use_graph_runner

    llm = make_llm(speculative_config=NGRAM)
    use_graph_runner(llm, max_batch=16)
    graphed = llm.engine.runner.graphed
    rows, run = [], graphed.run
    graphed.run = lambda chunks, device: rows.append(sum(c.num_new_tokens for c in chunks)) or run(chunks, device)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert _tokens(llm.generate(PROMPTS[:2], params)) == _tokens(plain.generate(PROMPTS[:2], params))
    assert llm.engine.spec_counters.num_accepted_tokens > 0
    assert max(rows) > 2  # two sequences, more rows: drafts went through the graph path

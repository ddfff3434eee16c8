"""In-process logprobs in vLLM's shape: CompletionOutput.logprobs is list[dict[int, Logprob]]
and RequestOutput.prompt_logprobs list[dict[int, Logprob] | None] (vllm/logprobs.py), each
position's dict the chosen token first, then the top k by rank, each Logprob with its
logprob, rank and decoded_token: the token decoded alone by the tokenizer (vLLM's
convert_ids_list_to_tokens), None where the request is not detokenized."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from inferlab.engine.outputs import Logprob
from inferlab.engine.sampling_params import SamplingParams

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def llm(make_fast_llm):
    return make_fast_llm()


def check_position(position: Mapping[int, Logprob], chosen: int, k: int, decoded) -> None:
    """vLLM's dict: {chosen: its rank, top 1..k: 1..k}; the chosen token keeps the first place
    (and, among the top, the top's rank), the others follow by rank."""
    keys = list(position)
    assert keys[0] == chosen and len(keys) == len(set(keys))
    by_rank = sorted(keys, key=lambda t: position[t].rank)
    assert keys[1:] == [t for t in by_rank if t != chosen]
    top = [t for t in by_rank if position[t].rank <= k]
    assert [position[t].rank for t in top] == list(range(1, k + 1))
    assert len(keys) == k + (chosen not in top)
    logprobs = [position[t].logprob for t in by_rank]
    assert logprobs == sorted(logprobs, reverse=True)
    for t, entry in position.items():
        assert isinstance(entry, Logprob) and entry.decoded_token == decoded(t)


def test_sample_logprobs_index_by_token_id_as_in_vllm(llm, hf_smollm_tokenizer):
    out = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=8,
                                              logprobs=2, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 8
    total = 0.0
    for position, token in zip(out.logprobs, out.token_ids, strict=True):
        check_position(position, token, 2, lambda t: hf_smollm_tokenizer.decode([t]))
        total += position[token].logprob
    assert out.cumulative_logprob == pytest.approx(total)


def test_a_chosen_token_outside_the_top_comes_first_with_its_own_rank(llm):
    """logprobs=0 lists only the chosen token; at a flat temperature some draw is not the
    likeliest, and its position lists it first, then the top one with rank 1."""
    out = llm.generate(PROMPT, SamplingParams(temperature=3.0, seed=1, max_tokens=16, logprobs=1,
                                              ignore_eos=True))[0].outputs[0]
    unlikely = [(p, t) for p, t in zip(out.logprobs, out.token_ids, strict=True) if len(p) == 2]
    assert unlikely
    for position, token in unlikely:
        assert list(position)[0] == token and position[token].rank > 1
        assert [e.rank for e in position.values()] == [position[token].rank, 1]
    alone = llm.generate(PROMPT, SamplingParams(temperature=3.0, seed=1, max_tokens=16,
                                                logprobs=0, ignore_eos=True))[0].outputs[0]
    assert [list(p) for p in alone.logprobs] == [[t] for t in alone.token_ids]


def test_prompt_logprobs_index_by_token_id_the_first_none(llm, hf_smollm_tokenizer):
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3))[0]
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for position, token in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:], strict=True):
        check_position(position, token, 3, lambda t: hf_smollm_tokenizer.decode([t]))


def test_decoded_token_is_none_without_detokenizing(llm):
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3, logprobs=2,
                                              prompt_logprobs=1, detokenize=False))[0]
    positions = [*out.outputs[0].logprobs, *out.prompt_logprobs[1:]]
    assert all(e.decoded_token is None for p in positions for e in p.values())
    assert out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]].rank == 1  # greedy


def test_beam_search_logprobs_name_their_tokens_text(llm, hf_smollm_tokenizer):
    """A beam's positions, as vLLM's beam search gives them: each token's decoded_token."""
    from inferlab import BeamSearchParams

    out = llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=4, logprobs=1))[0]
    for beam in out.outputs:
        assert len(beam.logprobs) == len(beam.token_ids)
        for position, token in zip(beam.logprobs, beam.token_ids, strict=True):
            assert position[token].decoded_token == hf_smollm_tokenizer.decode([token])

"""What a beam search takes from its request as any request does: the prompt cut by
truncate_prompt_tokens (vLLM's beam search gets it cut), the empty prompt refused as such,
the cache salt (cached blocks shared only under it) and the cached prompt tokens reported,
and skip_special_tokens for the text."""

from __future__ import annotations

import pytest

from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, InvalidParameterError

BLOCK_TOKENS = 16  # the engine's default KV block size


@pytest.fixture(scope="module")
def llm(make_fast_llm):
    engine = make_fast_llm(max_model_len=128)
    assert engine.engine.config.block_size == BLOCK_TOKENS
    return engine


def _cache_hits(llm) -> int:
    return llm.engine.scheduler.block_manager.prefix_cache_hit_tokens


def test_a_salted_search_shares_cached_blocks_only_under_its_salt(llm):
    """40 prompt tokens are 2 whole blocks (32 tokens) that a later request can be served. An
    unsalted request caches them; a search of one round under a new salt is served none of
    them, and reports 0; the same search again is served its own 2 blocks, and reports 32."""
    prompt = list(range(1000, 1040))
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    one_round = BeamSearchParams(beam_width=2, max_tokens=1, cache_salt="tenant-b")
    before = _cache_hits(llm)
    (first,) = llm.beam_search([prompt], one_round)
    assert _cache_hits(llm) - before == 0 and first.num_cached_tokens == 0
    (again,) = llm.beam_search([prompt], one_round)
    assert _cache_hits(llm) - before == 32 and again.num_cached_tokens == 32
    (unsalted,) = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=3))
    assert unsalted.num_cached_tokens == 32  # the plain request's blocks, three rounds or one
    with pytest.raises(InvalidParameterError, match="cache_salt must be a non-empty string"):
        BeamSearchParams(beam_width=2, cache_salt="")


def test_the_prompt_is_cut_to_its_last_tokens_as_a_request_is(llm):
    """truncate_prompt_tokens 6 searches the prompt's last 6 tokens (this tokenizer adds no
    BOS to keep), even a prompt over the 128-token context, which is otherwise refused."""
    text = "Paris is nice. Berlin is nice. Rome is nice. The capital of France is"
    ids = llm.tokenizer.encode(text)
    assert ids == llm.tokenizer.encode(text, add_special_tokens=False) and len(ids) > 6
    params = BeamSearchParams(beam_width=2, max_tokens=4, truncate_prompt_tokens=6)
    (cut,) = llm.beam_search(text, params)
    (expected,) = llm.beam_search([ids[-6:]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert cut.prompt_token_ids == ids[-6:]
    assert [c.token_ids for c in cut.outputs] == [c.token_ids for c in expected.outputs]
    long_text = "one two three " * 60
    with pytest.raises(InferlabError, match="no room for output"):
        llm.beam_search(long_text, BeamSearchParams(beam_width=2, max_tokens=4))
    (long_cut,) = llm.beam_search(long_text, params)
    assert long_cut.prompt_token_ids == llm.tokenizer.encode(long_text)[-6:]
    with pytest.raises(InvalidParameterError, match="truncate_prompt_tokens .129. is over the context"):
        llm.beam_search(text, BeamSearchParams(beam_width=2, truncate_prompt_tokens=129))
    with pytest.raises(InvalidParameterError, match="truncate_prompt_tokens must be at least 1"):
        BeamSearchParams(beam_width=2, truncate_prompt_tokens=0)


@pytest.mark.parametrize("prompt", ["", []])
def test_an_empty_prompt_is_refused_as_empty(llm, prompt):
    with pytest.raises(InferlabError, match="^the prompt is empty$"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=3))


def test_skip_special_tokens_false_keeps_them_in_the_text(llm):
    """A chat reply written past its <|im_end|> (ignore_eos): with skip_special_tokens false
    the text is the tokens' whole decoding, marks and all; by default they are left out."""
    chat = llm.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2? Answer "
                                               "with a number."}])
    ids = llm.tokenizer.encode(chat, add_special_tokens=False)
    backend = llm.tokenizer.backend
    kept, skipped = (llm.beam_search([ids], BeamSearchParams(
        beam_width=2, max_tokens=12, ignore_eos=True, skip_special_tokens=skip))[0] for skip in (False, True))
    assert any("<|im_end|>" in c.text for c in kept.outputs)  # the premise
    for with_marks, without in zip(kept.outputs, skipped.outputs, strict=True):
        assert with_marks.token_ids == without.token_ids
        assert with_marks.text == backend.decode(with_marks.token_ids, skip_special_tokens=False)
        assert without.text == backend.decode(without.token_ids, skip_special_tokens=True)
        assert "<|im_end|>" not in without.text

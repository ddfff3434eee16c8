"""OpenAI's json_object response format through the engine, on the embedded model: every
output that ends by EOS is a JSON object Python's json module reads; a cut one is a prefix of
one. The token filter's shortcuts are checked against reading every token in full."""

from __future__ import annotations

import dataclasses
import json

import pytest

from inferlab.engine.guided_json import JsonGuide, JsonTokenFilter, token_texts
from inferlab.engine.json_grammar import START, advance, is_complete
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError

SAMPLE = '{"name": "Zoë\\n", "tags": [1, -2.5e3, true, null], "nested": {"k": [{}, []]}}'


@pytest.fixture(scope="module")
def texts(make_llm) -> list[str | None]:
    return token_texts(make_llm().tokenizer)


def test_token_texts_spell_what_the_tokenizer_decodes(make_llm, texts):
    tokenizer = make_llm().tokenizer
    for text in (' {"a": 1}\n', "Hello world, it's 3.14!", "  two  spaces\tand tab", SAMPLE):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert "".join(texts[i] for i in ids) == tokenizer.decode(ids) == text
    assert all(texts[i] is None for i in tokenizer.all_special_ids)


# numbers and literals that whitespace ends, and whitespace runs of every kind
SPACED = '{\n\t"n" :  12\n ,"x":\t[ -0.5e3 \r\n, true\t] , "s" : " a\\tb " \n}'


@pytest.mark.parametrize("text", [SAMPLE, SPACED])
def test_the_filter_allows_exactly_the_tokens_the_grammar_takes(texts, text):
    token_filter = JsonTokenFilter(texts, len(texts))
    state = START
    for i, ch in enumerate(text):
        if i % 3 == 0 or ch in '"\\{}[]:, \t\n':  # strings, escapes, numbers, literals, structure
            read_in_full = [t for t, token in enumerate(texts)
                            if token is not None and advance(state, token) is not None]
            assert token_filter.allowed(state).nonzero().flatten().tolist() == read_in_full, text[:i]
        state = advance(state, ch)
    assert is_complete(state)


def test_a_guide_offers_eos_only_once_the_object_is_closed(texts):
    guide = JsonGuide(JsonTokenFilter(texts, len(texts)), eos_token_id=2)
    ids = [texts.index("{"), texts.index("}")]
    assert guide.allowed_now([])[ids[0]] and not guide.allowed_now([])[2]
    assert guide.allowed_now(ids[:1])[ids[1]] and not guide.allowed_now(ids[:1])[2]
    assert guide.allowed_now(ids) == [2]


def test_a_model_with_more_rows_than_tokens_never_samples_the_extra_rows(texts):
    token_filter = JsonTokenFilter(texts, len(texts) + 64)
    in_string = advance(START, '{"a": "b')
    assert token_filter.allowed(in_string).shape == (len(texts) + 64,)
    assert not token_filter.allowed(in_string)[len(texts):].any()


def test_json_object_outputs_are_json_objects(make_llm):
    llm = make_llm()
    conversations = [[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
                     [{"role": "user", "content": "Describe a cat as a JSON object."}]]
    greedy = SamplingParams(temperature=0, max_tokens=120, json_object=True)
    sampled = SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=120, json_object=True)
    stopped = 0
    for params in (greedy, sampled):
        for out in llm.chat(conversations, params):
            for completion in out.outputs:
                if completion.finish_reason == "stop":
                    assert isinstance(json.loads(completion.text), dict)
                    stopped += 1
                else:
                    assert completion.finish_reason == "length"
                    assert advance(START, completion.text) is not None
    assert stopped >= 4  # most of the eight end their object well within 120 tokens


@pytest.mark.parametrize(("fields", "words"), [
    ({"ignore_eos": True}, "cannot be combined"),
    ({"min_tokens": 3}, "cannot be combined"),
    ({"guided_choice": ["a"]}, "guided_choice and json_object"),
])
def test_json_object_refuses_what_would_fight_it(fields, words):
    with pytest.raises(InvalidParameterError, match=words):
        SamplingParams(json_object=True, **fields)


@pytest.mark.parametrize("fields", [{"json_object": True}, {"guided_choice": ["yes", "no"]}])
def test_guided_decoding_needs_an_eos_to_end_with(make_llm, monkeypatch, fields):
    llm = make_llm()
    without_eos = dataclasses.replace(llm.engine.generation, eos_token_id=None)  # as a model with none
    monkeypatch.setattr(llm.engine, "generation", without_eos)
    with pytest.raises(InvalidParameterError, match="ends its output with EOS, and this model has none"):
        llm.engine.add_request([1, 2, 3], SamplingParams(**fields))
    assert not llm.engine.has_unfinished_requests()

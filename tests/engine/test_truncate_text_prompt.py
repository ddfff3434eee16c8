"""truncate_prompt_tokens on a text prompt cuts it as transformers does when vLLM asks
(truncation=True, max_length=k, truncation_side="left"): the special tokens the tokenizer adds
stay, the text gives way. It once sliced the encoded ids, so a BOS was the first token cut."""

from __future__ import annotations

import asyncio

import pytest

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError
from tests.models.tiny_models import make_tiny_model
from tests.models.tiny_tokenizer import make_tokenizer, save_tokenizer

TEXT = " ".join(f"w{i}" for i in range(2, 12))  # ten words, one token each
TEMPLATES = ("<bos> $A", "<bos> $A </s>")


@pytest.fixture(scope="module", params=TEMPLATES)
def setup(request, tmp_path_factory):
    """(an engine over a tiny model and a tokenizer with this template, transformers' tokenizer
    over the same tokenizer.json, cutting from the left)."""
    import transformers

    directory = tmp_path_factory.mktemp("truncate")
    make_tiny_model("llama", directory)
    save_tokenizer(directory, request.param)
    llm = LLM(str(directory), dtype="float32", kv_cache_memory="1MiB", max_model_len=64)
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=make_tokenizer(request.param), truncation_side="left")
    return llm, reference


def _prompt_ids(llm: LLM, prompt, keep: int) -> list[int]:
    params = SamplingParams(max_tokens=1, truncate_prompt_tokens=keep)
    return llm.generate([prompt], params)[0].prompt_token_ids


@pytest.mark.parametrize("keep", [5, 3, 2])
def test_a_text_keeps_its_special_tokens_as_transformers_cuts_it(setup, keep):
    llm, reference = setup
    expected = reference(TEXT, truncation=True, max_length=keep).input_ids
    assert expected[0] == 1 and len(expected) == keep  # <bos> kept, words cut
    assert _prompt_ids(llm, TEXT, keep) == expected


@pytest.mark.parametrize("keep", [5, 2])
def test_the_servers_path_cuts_the_same(setup, keep):
    """The AsyncEngine encodes the text off the engine thread and hands the ids with it."""
    llm, reference = setup
    engine = AsyncEngine(llm.engine)

    async def run() -> list[int]:
        params = SamplingParams(max_tokens=1, truncate_prompt_tokens=keep)
        outputs = [out async for out in engine.generate(TEXT, params, f"cut-{keep}")]
        await engine.shutdown(timeout_s=10)
        return outputs[-1].prompt_token_ids

    assert asyncio.run(run()) == reference(TEXT, truncation=True, max_length=keep).input_ids


def test_token_ids_are_sliced_as_given(setup):
    """vLLM keeps the last k of token ids whatever they are, a BOS among them."""
    llm, reference = setup
    ids = reference(TEXT).input_ids
    assert _prompt_ids(llm, ids, 4) == ids[-4:]


def test_as_many_as_the_special_tokens_keeps_those_alone(setup):
    llm, reference = setup
    specials = len(reference(TEXT).input_ids) - len(TEXT.split())
    assert _prompt_ids(llm, TEXT, specials) == reference(TEXT, truncation=True,
                                                         max_length=specials).input_ids


def test_fewer_than_the_special_tokens_is_refused(setup):
    """transformers logs an error and cuts nothing there; here it is the request's error."""
    llm, reference = setup
    specials = len(reference(TEXT).input_ids) - len(TEXT.split())
    if specials < 2:
        pytest.skip("a template of one special token: 1 is the least truncate_prompt_tokens")
    with pytest.raises(InvalidParameterError, match=r"truncate_prompt_tokens \(1\) is less than "
                                                    r"the 2 special tokens the tokenizer adds"):
        _prompt_ids(llm, TEXT, 1)

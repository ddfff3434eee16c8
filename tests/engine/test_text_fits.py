"""The length check that refuses a hopeless text before encoding it holds only for tokenizers that
keep every character (the embedded byte-level one does: test_server_robustness refuses its
hopeless texts unencoded): a whitespace-splitting one once refused 25,000 spaces between two words
("at least 1250 tokens") that encode to 2."""

from __future__ import annotations

import pytest

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from tests.models.tiny_tokenizer import save_tiny_llama


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    return LLM(save_tiny_llama(tmp_path_factory.mktemp("text-fits")), dtype="float32",
               kv_cache_memory="1MiB")


def test_a_tokenizer_that_drops_spaces_is_not_judged_by_length(llm):
    assert not llm.engine.tokenizer.keeps_every_character
    out = llm.generate(["w5" + " " * 25_000 + "w6"], SamplingParams(max_tokens=1))[0]
    assert out.prompt_token_ids == [1, 6, 7]  # <bos> w5 w6
    with pytest.raises(InferlabError, match="the prompt has 201 tokens"):  # counted, then refused
        llm.generate([" ".join(["w5"] * 200)], SamplingParams(max_tokens=1))


"""The engine's totals as vLLM keeps them: a prompt counts once its prefill is done, not when it
is queued, and a request refused for one of its prompts leaves nothing queued nor counted.
Prompt tokens were once counted at add: a request aborted while waiting, or one whose other
prompt was refused (a 400), still added its prompt."""

from __future__ import annotations

import pytest

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from tests.models.tiny_tokenizer import save_tiny_llama

PROMPT = list(range(2, 12))  # 10 token ids of the tiny vocabulary
PARAMS = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("counters"))


def _run_to_end(llm: LLM) -> None:
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def test_a_prompt_counts_when_its_prefill_is_done(model_dir):
    """10 prompt tokens, 4 a step: steps of 4, 4 and 2 prompt tokens, the third samples the
    first token; the 10 count there, and not again at the decode step after."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB", max_num_batched_tokens=4,
              max_num_seqs=4)
    engine = llm.engine
    engine.add_request(PROMPT, PARAMS, "r")
    counted = []
    while engine.has_unfinished_requests():
        engine.step()
        counted.append(engine.counters.prompt_tokens)
    assert counted == [0, 0, 10, 10]
    assert engine.counters.generation_tokens == 2


def test_a_request_aborted_while_waiting_counts_no_prompt_token(model_dir):
    engine = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB").engine
    engine.add_request(PROMPT, PARAMS, "gone")
    engine.abort_request("gone")
    assert engine.counters.prompt_tokens == 0
    assert engine.counters.requests_finished == {}


def test_an_aborted_request_counts_as_no_finished_request(model_dir):
    """Aborted after its first token, as a client that leaves mid-stream: vLLM's frontend
    drops its state unrecorded, so request_success counts nothing for it (it counted 1 under
    finished_reason "abort"). Its prompt and token were computed: they count."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")
    engine = llm.engine
    engine.add_request(PROMPT, PARAMS, "left")
    engine.step()
    out = engine.abort_request("left")
    assert out is not None and out.outputs[0].finish_reason == "abort"
    assert engine.counters.requests_finished == {}
    assert (engine.counters.prompt_tokens, engine.counters.generation_tokens) == (10, 1)


def test_n_copies_each_count_the_prompt(model_dir):
    """vLLM runs each of n copies as a child request of its own, each counting its prompt's 5
    tokens (they were once counted once, as the first copy's)."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")
    llm.engine.add_request(PROMPT[:5], SamplingParams(n=3, max_tokens=2, ignore_eos=True), "n3")
    _run_to_end(llm)
    assert llm.engine.counters.prompt_tokens == 15
    assert llm.engine.counters.requests_finished == {"length": 3}


def test_prompts_added_together_are_all_checked_before_any_is_queued(model_dir):
    """The second prompt's token id is outside the vocabulary: the first is not queued either
    (it once was: it ran until the request failed, and counted), and its id stays free."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")
    engine = llm.engine
    with pytest.raises(InferlabError, match="outside the vocabulary"):
        engine.add_requests([("a", PROMPT, None), ("b", [99_999_999], None)], PARAMS)
    assert not engine.has_unfinished_requests()
    engine.add_request(PROMPT, PARAMS, "a")
    _run_to_end(llm)
    assert engine.counters.prompt_tokens == 10
    assert engine.counters.requests_finished == {"length": 1}


@pytest.mark.parametrize(("ids", "n"), [(("x", "x"), 1), (("y", "y#1"), 2)])
def test_ids_repeated_within_one_add_are_refused_with_nothing_queued(model_dir, ids, n):
    """Two prompts under one id; or, with n = 2, "y" whose second copy is "y#1" beside a prompt
    of that id."""
    engine = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB").engine
    params = SamplingParams(n=n, max_tokens=1)
    with pytest.raises(InferlabError, match=f"request id '{ids[1]}' is already in use"):
        engine.add_requests([(request_id, PROMPT, None) for request_id in ids], params)
    assert not engine.has_unfinished_requests()

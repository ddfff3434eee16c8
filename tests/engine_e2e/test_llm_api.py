"""LLM's offline API against vLLM's (vllm/entrypoints/llm.py): its prompt forms (PromptType),
max_tokens past the context (capped offline, a 400 from the server), its signatures
(sampling_params, use_tqdm, get_tokenizer), dtype names, and ValueError for bad input."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch

from inferlab.config import EngineConfig
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
HELLO = "Hello"


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(max_model_len=64)


def _texts(outputs) -> list[str]:
    return [o.outputs[0].text for o in outputs]


# -- prompts: vLLM's PromptType ---------------------------------------------------------------

def test_text_and_tokens_prompt_dicts_run_as_their_plain_forms(llm, hf_smollm_tokenizer):
    """vLLM's TextPrompt {"prompt": str} is the text, its TokensPrompt {"prompt_token_ids": ids}
    the ids (alone or in a list); numpy's integers are token ids too."""
    ids = hf_smollm_tokenizer.encode(HELLO)  # transformers' encoding: the reference
    plain = llm.generate([HELLO], GREEDY, use_tqdm=False)
    assert plain[0].prompt_token_ids == ids
    for prompts in ({"prompt": HELLO}, [{"prompt": HELLO}], {"prompt_token_ids": ids},
                    [{"prompt_token_ids": ids}], [{"prompt_token_ids": np.array(ids, np.int64).tolist()}],
                    [[np.int64(t) for t in ids]], [np.int64(t) for t in ids]):
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert (outputs[0].prompt_token_ids, _texts(outputs)) == (ids, _texts(plain)), prompts
    mixed = llm.generate([HELLO, {"prompt": HELLO}, {"prompt_token_ids": ids}, ids], GREEDY,
                         use_tqdm=False)
    assert _texts(mixed) == _texts(plain) * 4
    assert mixed[1].prompt == HELLO


@pytest.mark.parametrize(("prompts", "words"), [
    (["Hello", None], "prompt 1 must be a str, a list of token ids"),
    (["Hello", 5], "prompt 1 must be a str, a list of token ids, {'prompt': str} or"),
    ([b"Hello"], "got bytes"),  # once read as the token ids 72, 101...
    (b"Hello", "got bytes"),
    ([[1.5, 2]], "prompt 0: token ids must be integers, got float 1.5 at position 0"),
    ([[1, "7"]], "got str '7' at position 1"),
    ([{"prompt_token_ids": [19556]}, {"prompt_token_ids": ["prompt_token_ids"]}],
     "prompt 1: token ids must be integers"),  # once int('prompt_token_ids'): a raw ValueError
    ([{"prompt_token_ids": "abc"}], "'prompt_token_ids' must be a list of ints, got str"),
    ([{"prompt": 5}], "prompt 0: 'prompt' must be a str, got int"),
    ([{"prompt": "Hi", "multi_modal_data": {"image": None}}], "'multi_modal_data' not supported"),
    ([{"prompt_token_ids": [1], "prompt": "x"}], "prompt 0: 'prompt' not supported"),
    ([{"prompt_embeds": [0.5]}], "'prompt_embeds' not supported"),
    ([{}], "prompt 0: an empty dict"),
    (None, "prompts must be a str"),
])
def test_a_bad_prompt_is_a_value_error_naming_it(llm, prompts, words):
    with pytest.raises(ValueError) as caught:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert isinstance(caught.value, InferlabError) and words in str(caught.value)
    assert not llm.engine.has_unfinished_requests()


def test_chat_refuses_what_is_no_list_of_messages(llm):
    with pytest.raises(InferlabError, match="messages must be a list of messages"):
        llm.chat(None, GREEDY, use_tqdm=False)


# -- max_tokens past the context ---------------------------------------------------------------

def test_max_tokens_past_the_context_end_the_request_there_with_length(llm):
    """vLLM's offline engine ends a request at max_model_len (check_stop: num_tokens >=
    max_model_len, FINISHED_LENGTH_CAPPED) instead of refusing it; the batch beside it runs."""
    free = llm.engine.scheduler.stats().num_free_blocks
    prompt = list(range(1000, 1040))  # 40 tokens of a 64-token context
    capped, short = llm.generate([prompt, prompt[:5]], [
        SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), GREEDY], use_tqdm=False)
    out = capped.outputs[0]
    assert (len(prompt) + len(out.token_ids), out.finish_reason) == (64, "length")
    assert len(short.outputs[0].token_ids) == 3
    room = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert room.token_ids == out.token_ids  # the same request as one that asked for the room left
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.stats().num_free_blocks == free


def test_a_prompt_that_fills_the_context_is_still_refused(llm):
    with pytest.raises(ValueError, match="the prompt has 64 tokens, the context holds 64"):
        llm.generate([list(range(1000, 1064))], SamplingParams(max_tokens=1), use_tqdm=False)


def test_the_server_still_refuses_max_tokens_past_the_context(smollm_fp32):
    """vLLM's OpenAI server answers 400 for prompt + max_tokens over max_model_len."""
    from inferlab.engine.async_engine import AsyncEngine
    from inferlab.engine.llm_engine import LLMEngine
    from inferlab.server.app import create_app
    from inferlab.server.runner import ServerThread
    from inferlab.server.settings import ServerSettings

    engine = AsyncEngine(LLMEngine(EngineConfig(dtype="float32", kv_cache_memory_bytes=16 * 2**20,
                                                max_model_len=64), loaded=smollm_fp32))
    thread = ServerThread(create_app(engine, ServerSettings(served_model_name="m")))
    try:
        url = thread.start()
        body = {"model": "m", "prompt": list(range(1000, 1040)), "max_tokens": 64}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "prompt (40 tokens) + max_tokens (64) = 104 is over the context length 64" in r.text
        r = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        thread.stop()
        asyncio.run(engine.shutdown(timeout_s=0))


# -- signatures ------------------------------------------------------------------------------

def test_generate_and_chat_take_vllms_keywords(llm, hf_smollm_tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    by_name = llm.generate(HELLO, sampling_params=GREEDY, use_tqdm=False)
    assert _texts(by_name) == _texts(llm.generate([HELLO], GREEDY, use_tqdm=False))
    chatted = llm.chat(messages, sampling_params=GREEDY, use_tqdm=False)
    assert _texts(chatted) == _texts(llm.chat(messages, GREEDY, False))
    tokenizer = llm.get_tokenizer()
    assert tokenizer is llm.engine.tokenizer
    assert tokenizer.encode("The sky is blue.") == hf_smollm_tokenizer.encode("The sky is blue.")


def test_use_tqdm_shows_a_bar_of_the_prompts_done(llm, capsys):
    llm.generate(["a", "b"], GREEDY)  # vLLM's default: a bar on stderr
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "2/2" in err
    llm.generate(["a", "b"], GREEDY, use_tqdm=False)
    llm.beam_search(["a"], BeamSearchParams(beam_width=2, max_tokens=2))
    assert capsys.readouterr().err == ""


def test_use_tqdm_takes_the_bar_class_to_use(llm):
    made = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.done, self.closed = kwargs, 0, False
            made.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    llm.chat([[{"role": "user", "content": "Hi"}]] * 3, GREEDY, use_tqdm=Bar)
    assert [(b.kwargs["total"], b.done, b.closed) for b in made] == [(3, 3, True)]


# -- dtype names and ValueError --------------------------------------------------------------

@pytest.mark.parametrize(("dtype", "expected"), [
    ("float", torch.float32), (torch.float32, torch.float32), ("FLOAT32", torch.float32)])
def test_llm_takes_vllms_dtype_names(smollm_fp32, dtype, expected):
    assert LLM(loaded=smollm_fp32, dtype=dtype, kv_cache_memory="8MiB").engine.dtype == expected


def test_bad_requests_are_value_errors_as_in_vllm(llm, smollm_fp32):
    for call in (lambda: llm.generate(["a", "b"], [GREEDY], use_tqdm=False),
                 lambda: llm.generate([[1, 10**9]], GREEDY, use_tqdm=False),
                 lambda: llm.generate(["word " * 100], GREEDY, use_tqdm=False),
                 lambda: LLM(loaded=smollm_fp32, dtype="float32", max_model_len=10**7)):
        with pytest.raises(ValueError):
            call()

"""What a library caller hands the engine directly (LLM, AsyncEngine): each case once crashed a
step for every request, ran a request on values changed after it was added, or read a prompt
dict's keys as token ids."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, InvalidParameterError
from tests.models.tiny_tokenizer import save_tiny_llama

SEEDED = {"max_tokens": 12, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("library-inputs"))


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")


def _tokens(llm: LLM, prompt, params: SamplingParams) -> list[int]:
    return llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids


def test_a_numpy_seed_samples_as_the_same_python_seed(llm):
    # torch's manual_seed refused numpy's integer in the step, after the params had taken it
    assert _tokens(llm, "w2 w3", SamplingParams(seed=np.int64(5), **SEEDED)) == \
        _tokens(llm, "w2 w3", SamplingParams(seed=5, **SEEDED))


@pytest.mark.parametrize("sampling_params", [{"temperature": 0}, [None], "greedy"])
def test_params_of_another_type_are_one_line(llm, sampling_params):
    with pytest.raises(InferlabError, match="sampling_params must be a SamplingParams"):
        llm.generate(["w2"], sampling_params, use_tqdm=False)


def test_params_changed_to_a_bad_value_are_refused_at_the_next_add(llm):
    params = SamplingParams(max_tokens=2)
    params.logprobs = 100_000  # past the check that built it: once an index error in the step
    with pytest.raises(InvalidParameterError, match=r"logprobs must be in \[0, 20\]"):
        llm.generate("w2", params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_request_runs_on_its_params_as_they_were_when_added(model_dir, llm):
    """vLLM clones the params at add: changing the caller's object mid-run (to reuse it) once
    changed the running request's sampling."""
    alone = _tokens(llm, "w2 w3", SamplingParams(seed=3, **SEEDED))
    engine = AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32",
                                                  kv_cache_memory_bytes=2**20))

    async def main() -> list[int]:
        params = SamplingParams(seed=3, **SEEDED)
        outs = []
        async for out in engine.generate("w2 w3", params, "r"):
            params.temperature, params.seed = 0.0, 99  # the caller moves on
            outs.append(out)
        await engine.shutdown(0)
        return outs[-1].outputs[0].token_ids

    assert asyncio.run(main()) == alone


def test_async_generate_takes_vllms_prompt_dicts_and_refuses_the_rest(model_dir, llm):
    engine = AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32",
                                                  kv_cache_memory_bytes=2**20))
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    ids = llm.tokenizer.encode("w2 w3 w4", add_special_tokens=False)

    async def run(prompt, request_id: str) -> list[int]:
        outs = [out async for out in engine.generate(prompt, greedy, request_id)]
        return outs[-1].outputs[0].token_ids

    async def main() -> None:
        expected = await run("w2 w3 w4", "text")
        assert await run({"prompt": "w2 w3 w4"}, "text-dict") == expected
        assert await run({"prompt_token_ids": ids}, "ids-dict") == expected
        for bad in (None, 123, {7: 0, 9: 0}):  # a dict's keys once ran as token ids
            with pytest.raises(InferlabError, match="prompt 0"):
                await run(bad, f"bad-{bad}")
        await engine.shutdown(0)

    asyncio.run(main())


def test_each_streamed_output_holds_the_logprobs_of_its_own_tokens(model_dir):
    # token_ids were copied for each output while logprobs was one list that went on growing
    engine = AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32",
                                                  kv_cache_memory_bytes=2**20))

    async def main() -> list:
        params = SamplingParams(n=2, logprobs=1, seed=1, **SEEDED)
        outs = [out async for out in engine.generate("w2 w3", params, "r")]
        await engine.shutdown(0)
        return outs

    outs = asyncio.run(main())
    assert len(outs) > 2
    for out in outs:
        for completion in out.outputs:
            assert len(completion.logprobs) == len(completion.token_ids)


def test_chat_cuts_its_conversation_as_ids_and_reports_its_text(llm):
    """The template writes its own BOS, and the conversation's ids carry no tokenizer one: they
    are cut to the last k, as vLLM and the server cut them. Passing the text along once cut them
    as a text prompt's, keeping the BOS at the head."""
    template = "<bos>{% for m in messages %}{{ m['content'] }} {% endfor %}"
    conversation = [{"role": "user", "content": "w2 w3 w4 w5"}]

    def chat(**params):
        return llm.chat(conversation, SamplingParams(max_tokens=1, **params), use_tqdm=False,
                        chat_template=template)[0]

    whole, cut = chat(), chat(truncate_prompt_tokens=2)
    assert whole.prompt == "<bos>w2 w3 w4 w5 " and whole.prompt_token_ids[0] == 1
    assert cut.prompt_token_ids == whole.prompt_token_ids[-2:]
    assert cut.prompt is None  # the text no longer is what ran, as generate() reports a cut text


def test_a_copy_whose_seed_lands_on_minus_one_stays_seeded(llm):
    """n copies take seed, seed + 1, ...: from -2 the second's is -1, which for a request of its
    own means no seed; rebuilt as one, that copy once sampled anew on every run."""
    params = SamplingParams(n=2, seed=-2, **SEEDED)
    runs = [[c.token_ids for c in llm.generate("w2 w3", params, use_tqdm=False)[0].outputs]
            for _ in range(2)]
    assert runs[0] == runs[1]

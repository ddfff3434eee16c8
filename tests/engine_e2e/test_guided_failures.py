"""A guided request whose grammar cannot be followed fails alone (finish reason "error"), never
the engine: once, a 4,301-digit integer under a bounded schema raised in the engine thread (Python
reads no longer integer text) and an ambiguous grammar that nests doubled its readings with every
character (minutes and gigabytes of one step), stopping every request with it."""

from __future__ import annotations

import asyncio

import pytest

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.ebnf_grammar import EbnfGrammar
from inferlab.engine.grammar import MAX_READINGS
from inferlab.engine.json_grammar import JsonGrammar
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import GuidedDecodingError

AMBIGUOUS_EBNF = 'root ::= "a" root "x" | "a" root "y" | "z"'
TWIN_BRANCHES = {"$defs": {"a": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/a"}}] * 2}},
                 "$ref": "#/$defs/a"}


def _read(grammar, text: str):
    return grammar.advance(grammar.start, text)


def test_an_integer_longer_than_python_reads_is_held_to_its_bounds():
    digits = "7" * 5000
    at_least = JsonGrammar({"type": "integer", "minimum": 0})
    assert at_least.is_complete(_read(at_least, digits))
    assert _read(at_least, "-" + digits) is None
    at_most = JsonGrammar({"type": "number", "maximum": 100})
    assert _read(at_most, digits) is None and at_most.is_complete(_read(at_most, "-" + digits))


@pytest.mark.parametrize("grammar, char", [(EbnfGrammar(AMBIGUOUS_EBNF), "a"), (JsonGrammar(TWIN_BRANCHES), "[")])
def test_readings_past_the_limit_fail_the_guide(grammar, char):
    with pytest.raises(GuidedDecodingError, match="too ambiguous"):
        _read(grammar, char * 40)


def test_as_many_tools_as_the_limit_allows_stay_open():
    """tool_choice "required" over many tools is an anyOf of one object a tool: after the key
    "name" every tool is a reading until its name's letters tell them apart."""
    tools = MAX_READINGS // 2
    calls = {"type": "array", "items": {"anyOf": [
        {"type": "object", "required": ["name"], "properties": {"name": {"enum": [f"tool_{i}"]}}}
        for i in range(tools)]}}
    grammar = JsonGrammar(calls)
    assert grammar.is_complete(_read(grammar, f'[{{"name": "tool_{tools - 1}"}}]'))


def _forcing(llm, text: str) -> dict[int, float]:
    """A logit bias that makes greedy decoding write `text`'s one token again and again."""
    (token,) = llm.tokenizer.encode(text, add_special_tokens=False)
    return {token: 100.0}


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 2}])
def test_a_failing_guide_ends_its_request_alone(make_fast_llm, speculative):
    """With n-gram drafts too: a request that writes "a" again and again has drafts of "a",
    each held to the guide that fails."""
    llm = make_fast_llm(kv_cache_memory="64MiB", speculative_config=speculative)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["The capital of France is"], plain, use_tqdm=False)[0].outputs[0].token_ids
    stuck = SamplingParams(temperature=0, max_tokens=40, n=2, guided_grammar=AMBIGUOUS_EBNF,
                           logit_bias=_forcing(llm, "a"))
    failed, ok = llm.generate(["Go:", "The capital of France is"], [stuck, plain], use_tqdm=False)
    assert [c.finish_reason for c in failed.outputs] == ["error", "error"]
    assert "too ambiguous" in failed.error and set(failed.outputs[0].text) == {"a"}
    assert ok.outputs[0].token_ids == alone and ok.error is None
    scheduler = llm.engine.scheduler
    assert scheduler.block_manager.num_free_blocks == llm.engine.num_kv_blocks
    assert not scheduler.has_unfinished_requests()


def test_the_async_engine_raises_it_to_its_caller_and_goes_on(make_fast_llm):
    engine = AsyncEngine(make_fast_llm(kv_cache_memory="64MiB").engine)

    async def run(params: SamplingParams, request_id: str) -> str:
        text = ""
        async for out in engine.generate("Go:", params, request_id):
            text = out.outputs[0].text
        return text

    async def main() -> None:
        stuck = SamplingParams(temperature=0, max_tokens=40, json_schema=TWIN_BRANCHES,
                               logit_bias=_forcing(engine, "["))
        with pytest.raises(GuidedDecodingError, match="too ambiguous"):
            await asyncio.wait_for(run(stuck, "stuck"), 120)
        assert await asyncio.wait_for(run(SamplingParams(max_tokens=3, ignore_eos=True), "next"), 120)
        assert engine.is_healthy()
        await engine.shutdown()

    asyncio.run(main())

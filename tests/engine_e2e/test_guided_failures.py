"""Guided decoding a grammar cannot follow costs its own request at most, never the engine: once,
a 4,301-digit integer under a bounded schema raised in the engine thread (Python reads no longer
integer text), and an ambiguous grammar that nests doubled its readings with every character
(minutes and gigabytes of one step), stopping every request with it. Now the guide offers no
token past MAX_READINGS readings, and a request with no other way on fails alone (finish reason
"error")."""

from __future__ import annotations

import asyncio

import pytest

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.guided import grammar as grammar_module
from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.token_filter import GrammarFilters, GrammarGuide
from inferlab.engine.guided.token_index import token_index
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import GuidedDecodingError, InferlabError
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo
from tests.models.tiny_tokenizer import make_tokenizer

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
    wide = JsonGrammar({"type": "integer", "maximum": 10 ** 999})  # 1,000 digits, read exactly
    assert wide.is_complete(_read(wide, "9" * 999)) and _read(wide, "9" * 1001) is None
    with pytest.raises(InferlabError, match="at most 1000 digits"):  # str() stops at 4,300
        JsonGrammar({"type": "integer", "minimum": 10 ** 4299})


@pytest.mark.parametrize("grammar, char", [(EbnfGrammar(AMBIGUOUS_EBNF), "a"), (JsonGrammar(TWIN_BRANCHES), "[")])
def test_readings_past_the_limit_fail_the_guide(grammar, char):
    with pytest.raises(GuidedDecodingError, match="too ambiguous"):
        _read(grammar, char * 40)


def test_a_union_of_hundreds_of_objects_stays_open():
    """An anyOf of objects that all begin with a numeric key reads each number two ways (it may
    end or go on): 400 objects are 800 readings, within the limit (256 once cut the digits)."""
    objects = 400
    union = {"anyOf": [{"type": "object", "required": ["ts", f"k{i}"],
                        "properties": {"ts": {"type": "integer"}, f"k{i}": {"type": "string"}}}
                       for i in range(objects)]}
    grammar = JsonGrammar(union)
    assert grammar.is_complete(_read(grammar, f'{{"ts": 12, "k{objects - 1}": "x"}}'))


def test_an_alternation_of_thousands_of_words_is_a_grammar():
    """2,000 words open at once, some 77 for each first letter: a start state may hold more
    readings than a state after a character (refused as too ambiguous once). More than 1,024
    words that begin alike: tests/engine/test_ebnf_grammar.py."""
    words = [f"{chr(97 + i % 26)}{i:04d}" for i in range(2000)]
    grammar = EbnfGrammar("root ::= " + " | ".join(f'"{w}"' for w in words))
    assert grammar.is_complete(_read(grammar, words[-1]))


def test_rules_that_double_at_each_level_are_refused_as_they_grow():
    """20 levels of two alike calls expand to 2^20 stacks; counted only once built, that took
    79 s and 3.5 GB of the engine thread."""
    levels = "\n".join(f'l{i} ::= l{i + 1} "a" | l{i + 1} "b"' for i in range(1, 20))
    with pytest.raises(InferlabError, match="guided_grammar: the grammar is too ambiguous"):
        SamplingParams(guided_grammar=f'root ::= l1\n{levels}\nl20 ::= "x"')
    stepped = EbnfGrammar(f'root ::= "s" l1\n{levels}\nl20 ::= "x"')
    with pytest.raises(GuidedDecodingError):
        _read(stepped, "s")


def _forcing(llm, text: str) -> dict[int, float]:
    """A logit bias that makes greedy decoding write `text`'s one token again and again."""
    (token,) = llm.tokenizer.encode(text, add_special_tokens=False)
    return {token: 100.0}


def test_the_guide_steers_around_what_it_could_not_follow(make_fast_llm):
    """Forced to write "a" (each doubles the readings), the reply is given only tokens that keep
    them within the limit: it closes the nesting and ends as a whole root."""
    llm = make_fast_llm(kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0, max_tokens=60, guided_grammar=AMBIGUOUS_EBNF,
                            logit_bias=_forcing(llm, "a"))
    out = llm.generate(["Go:"], params, use_tqdm=False)[0].outputs[0]
    opened, closed = out.text.split("z")
    assert out.finish_reason == "stop" and set(opened) == {"a"} and set(closed) <= {"x", "y"}
    assert len(opened) == len(closed) >= 3
    _read(EbnfGrammar(AMBIGUOUS_EBNF), opened)
    with pytest.raises(GuidedDecodingError):  # one more "a" was past the limit
        _read(EbnfGrammar(AMBIGUOUS_EBNF), opened + "a")


@pytest.fixture
def one_reading(monkeypatch):
    """Grammars that read no text in two ways: "a" then "b" or "c" fails at its "a"."""
    monkeypatch.setattr(grammar_module, "MAX_READINGS", 1)
    return f'root ::= "a" "b" | "a" "c"  # {id(monkeypatch)}'  # a grammar no cache knows


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 2}])
def test_a_guide_with_no_way_on_fails_its_request_alone(make_fast_llm, one_reading, speculative):
    llm = make_fast_llm(kv_cache_memory="64MiB", speculative_config=speculative)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["The capital of France is"], plain, use_tqdm=False)[0].outputs[0].token_ids
    stuck = SamplingParams(temperature=0, max_tokens=40, n=2, guided_grammar=one_reading)
    failed, ok = llm.generate(["Go:", "The capital of France is"], [stuck, plain], use_tqdm=False)
    assert [c.finish_reason for c in failed.outputs] == ["error", "error"]
    assert "too ambiguous" in failed.error and failed.outputs[0].token_ids == []
    assert ok.outputs[0].token_ids == alone and ok.error is None
    scheduler = llm.engine.scheduler
    assert scheduler.block_manager.num_free_blocks == llm.engine.num_kv_blocks
    assert not scheduler.has_unfinished_requests()


def test_a_dead_end_fails_alike_with_drafts_or_without(make_fast_llm, monkeypatch):
    """After "a" * 7 no token keeps this grammar within 256 readings, though "a" is offered at
    "a" * 6. Drafted, the row after a kept "a" once sampled the end token and the request ended
    "stop" on text the grammar does not finish; then it failed a step early, short of the
    tokens the undrafted run wrote. Both now end alike."""
    monkeypatch.setattr(grammar_module, "MAX_READINGS", 256)
    text = ('root ::= r\nr ::= "a" r "x" | "a" r "y" | "z" t\n'
            't ::= "q" | "w" | "e" | "r" | "t" | "u" | "i" | "o"  # dead end')
    outputs = []
    for speculative in (None, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                               "prompt_lookup_min": 1}):
        llm = make_fast_llm(kv_cache_memory="64MiB", speculative_config=speculative)
        params = SamplingParams(max_tokens=20, temperature=0, guided_grammar=text,
                                logit_bias=_forcing(llm, "a"))
        (out,) = llm.generate(["a a a a a a a a a a a a a a a a"], params, use_tqdm=False)
        assert out.outputs[0].finish_reason == "error" and "too ambiguous" in out.error
        outputs.append(out.outputs[0].token_ids)
    assert outputs[0] == outputs[1] and llm.tokenizer.decode(outputs[0]) == "a" * 7


def test_a_guide_that_raises_fails_its_request_not_the_engine(make_fast_llm, monkeypatch):
    """A bug in a guide (any exception) costs its own request, which says what it was."""
    llm = make_fast_llm(kv_cache_memory="64MiB")

    def broken(self, output, drafts=()):
        raise RuntimeError("a bug")

    monkeypatch.setattr(GrammarGuide, "allowed_now", broken)
    params = SamplingParams(max_tokens=5, guided_regex="[a-z]+")
    failed, ok = llm.generate(["Go:", "Go:"], [params, SamplingParams(max_tokens=5)], use_tqdm=False)
    assert failed.outputs[0].finish_reason == "error" and "RuntimeError: a bug" in failed.error
    assert ok.outputs[0].finish_reason == "length"


def test_the_async_engine_raises_it_to_its_caller_and_goes_on(make_fast_llm, one_reading):
    engine = AsyncEngine(make_fast_llm(kv_cache_memory="64MiB").engine)

    async def run(params: SamplingParams, request_id: str) -> str:
        text = ""
        async for out in engine.generate("Go:", params, request_id):
            text = out.outputs[0].text
        return text

    async def main() -> None:
        with pytest.raises(GuidedDecodingError, match="too ambiguous"):
            await asyncio.wait_for(run(SamplingParams(guided_grammar=one_reading), "stuck"), 120)
        assert await asyncio.wait_for(run(SamplingParams(max_tokens=3, ignore_eos=True), "next"), 120)
        assert engine.is_healthy()
        await engine.shutdown()

    asyncio.run(main())


def test_a_grammar_no_token_can_follow_fails_its_request():
    """A vocabulary that cannot spell what the grammar takes next (a word-level one, whose
    tokens read " w2", " w3"..., and no "z"): the output cannot be whole, so the guide fails there rather than end it at EOS as if
    it were (the request's finish reason is then "error")."""
    tokenizer = TextTokenizer(make_tokenizer(), TokenizerInfo(bos_token="<bos>", eos_token="</s>"))
    filters = GrammarFilters(lambda: token_index(tokenizer, tokenizer.vocab_size), eos_token_id=2)
    guide = filters.guide("ebnf", 'root ::= " w2" "z" | " w3"')
    w2, w3 = tokenizer.encode("w2 w3", add_special_tokens=False)
    assert guide.allowed_now([w3]).nonzero().flatten().tolist() == [2]  # whole: EOS only
    guide = filters.guide("ebnf", 'root ::= " w2" "z" | " w3"')
    with pytest.raises(GuidedDecodingError, match="no token of the vocabulary spells"):
        guide.allowed_now([w2])


def test_half_a_surrogate_pair_matches_no_text(make_fast_llm):
    """No text holds one: the branch that needs it is left out, a grammar of nothing else refused."""
    grammar = EbnfGrammar('root ::= "x" [\ud800-\udbff] | "y"')
    assert grammar.advance(grammar.start, "x") is None and grammar.is_complete(_read(grammar, "y"))
    llm = make_fast_llm(kv_cache_memory="64MiB")
    with pytest.raises(InferlabError, match="matches no text"):
        llm.generate(["Go:"], SamplingParams(max_tokens=4, guided_grammar='root ::= "x" [\ud800-\udbff]'),
                     use_tqdm=False)

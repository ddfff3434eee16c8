"""Guided decoding by grammar through the engine, on the embedded model: json_object, json_schema,
guided_regex, guided_grammar and structural tags. Every output that ends by EOS is a JSON object Python's json
module reads, a value jsonschema validates against the schema, a text Python's re matches whole,
or one lark parses; a cut one is a prefix of one. The token filter's shortcuts are checked against reading every token in
full."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
import torch
from lark import Lark

from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import OBJECT_SCHEMA
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.structural_tag import StructuralTagGrammar
from inferlab.engine.guided.thinking_grammar import AfterThinking
from inferlab.engine.guided.token_filter import GRAMMARS, GrammarGuide, TokenFilter
from inferlab.engine.guided.token_index import TokenIndex, appended_texts, token_index
from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.structured_outputs import StructuredOutputsParams
from inferlab.errors import InvalidParameterError

GRAMMAR = JsonGrammar(OBJECT_SCHEMA)
START = GRAMMAR.start
advance, is_complete = GRAMMAR.advance, GRAMMAR.is_complete
SAMPLE = '{"name": "Zoë\\n", "tags": [1, -2.5e3, true, null], "nested": {"k": [{}, []]}}'


@pytest.fixture(scope="module")
def texts(make_fast_llm) -> list[str | None]:
    return appended_texts(make_fast_llm().tokenizer)


def test_token_texts_spell_what_the_tokenizer_decodes(make_fast_llm, texts):
    tokenizer = make_fast_llm().tokenizer
    for text in (' {"a": 1}\n', "Hello world, it's 3.14!", "  two  spaces\tand tab", SAMPLE):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert "".join(texts[i] for i in ids) == tokenizer.decode(ids) == text
    assert all(texts[i] is None for i in tokenizer.all_special_ids)
    # a character the vocabulary spells in byte tokens: no byte is a character of its own
    ids = tokenizer.encode("\u05e2", add_special_tokens=False)
    assert len(ids) == 2 and tokenizer.decode(ids) == "\u05e2"
    assert [texts[i] for i in ids] == [None, None]


@pytest.fixture(scope="module")
def index(make_fast_llm) -> TokenIndex:
    tokenizer = make_fast_llm().tokenizer
    return token_index(tokenizer, tokenizer.vocab_size)


def test_byte_tokens_spell_the_utf8_of_what_they_write(make_fast_llm, index):
    tokenizer = make_fast_llm().tokenizer
    text = "Zoë écrit עברית, 中文 and 😀!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    spelled = [index.spelling.get(i) or index.texts[i].encode() for i in ids]
    assert b"".join(spelled) == text.encode() and any(i in index.spelling for i in ids)
    # a byte-level vocabulary: every token without a text of its own is spelled in bytes
    assert set(index.spelling) == {i for i, t in enumerate(index.texts) if t is None} - tokenizer.all_special_ids


HEBREW_LETTERS = [chr(c).encode() for c in range(0x5D0, 0x5EB)]


def test_a_guide_takes_the_byte_tokens_that_begin_an_allowed_character(index):
    """One Hebrew letter: first its text tokens and the byte tokens a letter's UTF-8 begins
    with; after its first byte, the bytes that end one; EOS only once it is whole."""
    token_filter = TokenFilter(RegexGrammar("[\u05d0-\u05ea]"), index, eos_token_id=2)
    guide = GrammarGuide(token_filter)
    first = guide.allowed_now([]).nonzero().flatten().tolist()
    assert first == sorted([i for i, raw in index.spelling.items() if any(h.startswith(raw) for h in HEBREW_LETTERS)]
                           + [i for i, t in enumerate(index.texts) if t is not None and t.encode() in HEBREW_LETTERS])
    (lead,) = [i for i, raw in index.spelling.items() if raw == b"\xd7"]
    ending = guide.allowed_now([lead]).nonzero().flatten().tolist()
    assert ending == [i for i, raw in index.spelling.items() if b"\xd7" + raw in HEBREW_LETTERS]
    (aleph_end,) = [i for i, raw in index.spelling.items() if raw == b"\x90"]  # U+05D0 is d7 90
    assert guide.allowed_now([lead, aleph_end]).nonzero().flatten().tolist() == [2]


@pytest.mark.parametrize(("guide", "check"), [
    ({"guided_regex": "[\u05d0-\u05ea ]{2,8}"}, lambda text: re.fullmatch("[\u05d0-\u05ea ]{2,8}", text)),
    ({"json_schema": {"type": "string", "maxLength": 3}}, lambda text: len(json.loads(text)) <= 3),
    ({"guided_grammar": 'root ::= [^a-zA-Z"]{2,6}'}, lambda text: re.fullmatch('[^a-zA-Z"]{2,6}', text)),
    # enum texts are written exactly: once the vocabulary let in U+05E9 and then only EOS
    ({"json_schema": {"enum": ["\u05e2\u05dd", "\u05e9\u05dd"]}},
     lambda text: json.loads(text) in ("\u05e2\u05dd", "\u05e9\u05dd")),
])
def test_guided_replies_write_characters_spelled_only_in_bytes(make_fast_llm, index, guide, check):
    """Hebrew's UTF-8 lead byte made likelier: the guide lets it in, then holds the reply to a
    byte that ends a character it takes (a reply cut short ends within its last character)."""
    llm = make_fast_llm()
    (lead,) = [i for i, raw in index.spelling.items() if raw == b"\xd7"]
    params = SamplingParams(temperature=1.0, seed=5, n=4, max_tokens=24, logit_bias={lead: 8}, **guide)
    kind, spec = params.grammar
    grammar = GRAMMARS[kind](spec)
    (out,) = llm.chat([[{"role": "user", "content": "Write a word in Hebrew."}]], params)
    for completion in out.outputs:
        assert any(index.spelling.get(i) == b"\xd7" for i in completion.token_ids), completion.text
        if completion.finish_reason == "stop":
            assert "\ufffd" not in completion.text and check(completion.text), completion.text
        else:
            assert grammar.advance(grammar.start, completion.text.rstrip("\ufffd")) is not None


# numbers and literals that whitespace ends, and whitespace runs of every kind
SPACED = '{\n\t"n" :  12\n ,"x":\t[ -0.5e3 \r\n, true\t] , "s" : " a\\tb " \n}'


# declared keys and enum strings with whitespace inside, where whitespace is not between tokens
PET = {"type": "object", "required": ["first name"], "properties": {
    "first name": {"type": "string"}, "mood": {"enum": ["so  so", "ok", 10, 1]},
    "legs": {"type": "integer"}, "extra": {"type": "object", "additionalProperties": {"type": "number"},
                                           "properties": {"id": {"type": "string"}}}}}
PET_SAMPLE = '{ "first name":"Rex \\"R\\"", "mood" : "so  so", "legs": 4, "extra": {"id":"a","w": 1.5}}'


DATE = r"\s*(\d{4})-(0[1-9]|1[0-2])-\d\d( at \d+:\d\d)?\.?\s*"  # whitespace that loops, too
ANSWER = '''
root ::= "The answer is " ("yes" | "no" | [0-9]{1,3}) (", because " [a-z ]{1,40})? "."
'''
ANSWER_LARK = Lark('root: "The answer is " ("yes" | "no" | /[0-9]/ ~ 1..3) (", because " /[a-z ]/ ~ 1..40)? "."',
                   start="root", parser="earley", lexer="dynamic")


@pytest.mark.parametrize(("grammar", "text"), [
    (GRAMMAR, SAMPLE), (GRAMMAR, SPACED), (JsonGrammar(PET), PET_SAMPLE),
    (JsonGrammar({"enum": [1, 12]}), "12"),
    (JsonGrammar({"type": "object", "properties": {"d": {"format": "date"}, "t": {"pattern": "^[a-z ]+$"}}}),
     '{"d":"2024-12-02","t":"a\\u0062 c"}'), (RegexGrammar(DATE), " \n2024-12-02 at 11:45. \t"),
    # any whitespace, then only spaces: a second whitespace is not read as the first
    (RegexGrammar(r"a\s( b|  +(the|of))"), "a   the"),
    (EbnfGrammar(ANSWER), "The answer is 42, because it is."),
    (JsonGrammar({"properties": {"n": {"type": "number", "minimum": -1.5, "maximum": 20}}}), '{"n": -0.25}'),
    # strings held to a length: the tokens of plain text counted, not read
    (JsonGrammar({"type": "string", "minLength": 2, "maxLength": 7}), '"a b, c"'),
    (JsonGrammar({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "maxLength": 9}]}), '"xyz\\n q"'),
    (JsonGrammar({"anyOf": [{"type": "string", "maxLength": 4}, {"type": "string", "pattern": "^a+$"}]}), '"aaaaa"'),
    (StructuralTagGrammar({"structures": [{"begin": "<f=w>", "schema": PET, "end": "</f>"}], "triggers": ["<f="]}),
     'Sure < <f <f=w>{"first name": "Rex", "legs": 4}</f> then {"a": 1}'),
    (AfterThinking(RegexGrammar(DATE), closer="</think>"), "Hm, a < b </thi no.</think>\n2024-12-02"),
    # a trigger inside many tokens (" about", "table"): those die in free text, unless "ab:" follows
    (StructuralTagGrammar({"structures": [{"begin": "ab:", "schema": {"type": "integer"}, "end": "."}],
                           "triggers": ["ab"]}), "We ab:12. go"),
])
def test_the_filter_allows_exactly_the_tokens_the_grammar_takes(texts, grammar, text):
    token_filter = TokenFilter(grammar, TokenIndex(texts, len(texts)), eos_token_id=2)
    state = grammar.start
    for i, ch in enumerate(text):
        if i % 3 == 0 or ch in '"\\{}[]:, \t\n' or text[0] == '"':  # strings, escapes, numbers, literals, structure
            read_in_full = [t for t, token in enumerate(texts)
                            if token is not None and grammar.advance(state, token) is not None]
            if grammar.is_complete(state):
                read_in_full.append(2)
            assert token_filter.allowed(state).nonzero().flatten().tolist() == sorted(read_in_full), text[:i]
        state = grammar.step(state, ch)
    assert grammar.is_complete(state)


def test_tokens_longer_than_the_index_holds_are_read_whole(texts):
    """The filter walks the first `depth` characters of every token together, then reads the
    rest of each: indexes of one and of four characters give the masks of the full one."""
    grammar = EbnfGrammar(ANSWER)
    one, four, full = (TokenFilter(grammar, TokenIndex(texts, len(texts), depth=d), eos_token_id=2) for d in (1, 4, 24))
    state = grammar.start
    for ch in "The answer is 42, because it is.":
        assert torch.equal(one.allowed(state), full.allowed(state))
        assert torch.equal(four.allowed(state), full.allowed(state))
        state = grammar.step(state, ch)


def test_a_guide_offers_eos_only_once_the_object_is_closed(texts):
    guide = GrammarGuide(TokenFilter(GRAMMAR, TokenIndex(texts, len(texts)), eos_token_id=2))
    ids = [texts.index("{"), texts.index("}")]
    assert guide.allowed_now([])[ids[0]] and not guide.allowed_now([])[2]
    assert guide.allowed_now(ids[:1])[ids[1]] and not guide.allowed_now(ids[:1])[2]
    assert guide.allowed_now(ids).nonzero().flatten().tolist() == [2]


def test_a_model_with_more_rows_than_tokens_never_samples_the_extra_rows(texts):
    token_filter = TokenFilter(GRAMMAR, TokenIndex(texts, len(texts) + 64), eos_token_id=2)
    in_string = advance(START, '{"a": "b')
    assert token_filter.allowed(in_string).shape == (len(texts) + 64,)
    assert not token_filter.allowed(in_string)[len(texts):].any()


CAT = {"type": "object", "required": ["name", "age", "colors"], "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "colors": {"type": "array", "items": {"enum": ["black", "white", "orange"]}, "minItems": 1,
               "maxItems": 2},
    "indoor": {"type": "boolean"}}}


MAX_TOKENS = 160  # at 100, three of json_object's eight replies ended, once byte tokens left the masks


@pytest.mark.parametrize(("guide", "check", "prompts"), [
    ({"json_object": True}, lambda text: isinstance(json.loads(text), dict),
     ["What is the capital of France? Answer in JSON.", "Describe a cat as a JSON object."]),
    ({"json_schema": CAT}, lambda text: jsonschema.validate(json.loads(text), CAT) is None,
     ["Describe a cat as a JSON object.", "Tell me about your neighbour's cat."]),
    ({"guided_regex": DATE}, lambda text: re.fullmatch(DATE, text),
     ["When did the Berlin wall fall? Give the date.", "What is today's date?"]),
    ({"guided_grammar": ANSWER}, ANSWER_LARK.parse,
     ["Is the sky blue? Say why.", "How many legs does a spider have?"]),
    # once one character of three bytes (byte tokens read as three U+FFFD characters)
    ({"guided_regex": "[^\\x00-\\x7f]{3}"}, lambda text: re.fullmatch("[^\\x00-\\x7f]{3}", text),
     ["Write something in Hebrew.", "Write three accented letters."]),
])
def test_guided_outputs_are_what_the_format_asks(make_fast_llm, guide, check, prompts):
    llm = make_fast_llm()
    conversations = [[{"role": "user", "content": prompt}] for prompt in prompts]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, **guide)
    sampled = SamplingParams(temperature=1.0, seed=3, n=4, max_tokens=MAX_TOKENS, **guide)
    kind, spec = greedy.grammar
    grammar = GRAMMARS[kind](spec)
    stopped = 0
    # one batch: each conversation greedy and sampled four times
    outputs = llm.chat(conversations * 2, [greedy] * len(prompts) + [sampled] * len(prompts))
    for out in outputs:
        for completion in out.outputs:
            if completion.finish_reason == "stop":
                assert check(completion.text), completion.text
                stopped += 1
            else:
                assert completion.finish_reason == "length"
                assert grammar.advance(grammar.start, completion.text) is not None
    assert stopped >= 4  # enough of the ten end their value within MAX_TOKENS to be checked


TAG = {"structures": [
    {"begin": "<n>", "schema": {"type": "integer", "minimum": 0, "maximum": 99}, "end": "</n>"},
    {"begin": "<city>", "schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
                                   "required": ["name"]}, "end": "</city>"}],
    "triggers": ["<"]}


def test_a_structural_tag_holds_what_follows_each_trigger(make_fast_llm):
    """Prompts that show the tags, and "<" a little likelier: whatever follows a "<" is a whole
    tag, by the definition (engine.test_structural_tag.reference); a cut reply is so up to its
    last end."""
    from engine.test_structural_tag import reference

    llm = make_fast_llm()
    (less_than,) = llm.tokenizer.encode("<", add_special_tokens=False)
    conversations = [[{"role": "user", "content": prompt}] for prompt in (
        "How many legs does a spider have? Answer like this: <n>5</n>",
        'Which city is the capital of France? Answer like this: <city>{"name": "Rome"}</city>')]
    grammar = StructuralTagGrammar(TAG)
    tags = 0
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1, n=3)):
        params = dataclasses.replace(params, max_tokens=60, structural_tag=TAG, logit_bias={less_than: 5})
        for completion in (c for out in llm.chat(conversations, params) for c in out.outputs):
            text = completion.text
            tags += text.count("</n>") + text.count("</city>")
            if completion.finish_reason == "stop":
                assert reference(TAG, text), text
            else:
                assert grammar.advance(grammar.start, text) is not None, text
                last = max(text.rfind("</n>") + 4, text.rfind("</city>") + 7)
                assert reference(TAG, text[:last]), text
    assert tags >= 8


def test_a_schema_s_top_level_number_may_end_or_go_on(make_fast_llm):
    llm = make_fast_llm()
    eos = llm.engine.generation.eos_token_id
    for eos_bias, text in ((100, "1"), (-100, "123")):  # EOS is offered at "1", "12" and "123"
        params = SamplingParams(temperature=1.0, seed=0, n=3, max_tokens=6, logit_bias={eos: eos_bias},
                                json_schema={"enum": [1, 12, 123]})
        outputs = llm.generate(["Pick a number:"], params)[0].outputs
        assert [(c.text, c.finish_reason) for c in outputs] == [(text, "stop")] * 3


@pytest.mark.parametrize(("fields", "words"), [
    ({"ignore_eos": True}, "cannot be combined"),
    ({"min_tokens": 3}, "cannot be combined"),
    ({"guided_choice": ["a"]}, "guided_choice and json_object cannot"),
    ({"json_schema": {"type": "object"}}, "json_object and json_schema cannot"),
])
def test_json_object_refuses_what_would_fight_it(fields, words):
    with pytest.raises(InvalidParameterError, match=words):
        SamplingParams(json_object=True, **fields)


@pytest.mark.parametrize(("fields", "words"), [
    ({"json_schema": {"type": "integer", "multipleOf": 2}}, "json_schema: JSON schema keyword 'multipleOf'"),
    ({"guided_grammar": 'root ::= "a" | b'}, "guided_grammar: grammar: rule 'b' is used but never defined"),
    ({"guided_grammar": ["root ::= x"]}, "guided_grammar: a grammar must be a string"),
    ({"guided_grammar": 'root ::= "a"', "guided_regex": "a"}, "guided_regex and guided_grammar cannot be combined"),
])
def test_a_grammar_that_cannot_be_held_is_refused_by_name(fields, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        SamplingParams(**fields)


@pytest.mark.parametrize("fields", [{"json_object": True}, {"json_schema": CAT},
                                    {"guided_regex": DATE}, {"guided_grammar": ANSWER},
                                    {"guided_choice": ["yes", "no"]}])
def test_guided_decoding_needs_an_eos_to_end_with(make_fast_llm, monkeypatch, fields):
    llm = make_fast_llm()
    without_eos = dataclasses.replace(llm.engine.generation, eos_token_id=None)  # as a model with none
    monkeypatch.setattr(llm.engine.requests, "generation", without_eos)  # where requests are checked
    with pytest.raises(InvalidParameterError, match="ends its output with EOS, and this model has none"):
        llm.engine.add_request([1, 2, 3], SamplingParams(**fields))
    assert not llm.engine.has_unfinished_requests()


def test_guided_by_vllm_s_grouped_object_gives_the_separate_field_s_tokens(make_fast_llm):
    """Code written for vLLM (structured_outputs=StructuredOutputsParams(...), a dict of its
    fields, the older guided_decoding=) gets the tokens guided_choice and json_schema give
    (test_sampling.py's test_guided_choice_outputs_are_the_choices checks those against the choices)."""
    llm = make_fast_llm()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    cases = [({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
             ({"json_schema": schema}, {"json": json.dumps(schema)})]
    for separate, grouped in cases:
        spellings = [separate, {"structured_outputs": StructuredOutputsParams(**grouped)},
                     {"structured_outputs": grouped}, {"guided_decoding": grouped}]
        outputs = [[[(c.token_ids, c.text) for c in out.outputs] for out in llm.generate(
            ["Is the sky blue?", "Once upon a time"],
            [SamplingParams(temperature=0, max_tokens=12, **fields),
             SamplingParams(temperature=1.2, seed=3, n=3, max_tokens=12, **fields)])]
            for fields in spellings]
        assert outputs[1:] == [outputs[0]] * 3, grouped

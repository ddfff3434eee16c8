"""Guides over byte tokens: splitting bytes into characters and the start of one more, the range
of characters such a start can end as, and whether a grammar takes one of a range; hand-checked
against the UTF-8 encoding (RFC 3629) and the grammars' own character classes."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers

from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.ebnf_parse import Matcher
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.structural_tag import StructuralTagGrammar
from inferlab.engine.guided.thinking_grammar import AfterThinking
from inferlab.engine.guided.token_index import appended_texts
from inferlab.engine.utf8_tokens import byte_spellings, completions, split_utf8
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo

HEBREW = ("\u05c0", "\u05ff")  # what b"\xd7" can end as: 110_10111 10xxxxxx


@pytest.mark.parametrize(("data", "split"), [
    (b"a\xe4\xb8", ("a", b"\xe4\xb8")),          # one whole character, two bytes of the next
    (b"\xe4\xb8\xad", ("\u4e2d", b"")),
    (b"\xd7", ("", b"\xd7")),
    (b"\xf0\x9f\x98", ("", b"\xf0\x9f\x98")),
    (b"\x80", None),                              # a continuation byte cannot start a character
    (b"a\xa2", None),
    (b"\xe0\x80", None),                          # an overlong form begun
    (b"\xf4\x90", None),                          # beyond U+10FFFF
    (b"\xed\xa0", None),                          # a surrogate begun
    (b"\xc0", None), (b"\xf5", None),             # bytes that never occur in UTF-8
])
def test_split_utf8(data, split):
    assert split_utf8(data) == split


@pytest.mark.parametrize(("tail", "first", "last"), [
    (b"\xd7", 0x5C0, 0x5FF),
    (b"\xc2", 0x80, 0xBF),
    (b"\xe4\xb8", 0x4E00, 0x4E3F),
    (b"\xe0", 0x800, 0xFFF),
    (b"\xed", 0xD000, 0xD7FF),                    # the surrogates D800-DFFF are not characters
    (b"\xf0", 0x10000, 0x3FFFF),
    (b"\xf0\x9f\x98", 0x1F600, 0x1F63F),
    (b"\xf4\x8f", 0x10F000, 0x10FFFF),
])
def test_completions_are_the_characters_a_start_can_end_as(tail, first, last):
    assert completions(tail) == (chr(first), chr(last))
    assert chr(first).encode().startswith(tail) and chr(last).encode().startswith(tail)


def test_matcher_meets_a_range_where_some_character_matches():
    hebrew = Matcher(((("\u05d0", "\u05ea")),))
    assert hebrew.meets(*HEBREW) and not hebrew.meets("\u4e00", "\u4e3f")
    assert Matcher(((("\u05d0", "\u05ea")),), negated=True).meets(*HEBREW)  # U+05C0-05CF is free
    covering = Matcher((("\u05c0", "\u05cf"), ("\u05d0", "\u05ff")), negated=True)
    assert not covering.meets(*HEBREW) and covering.meets("\u05c0", "\u0600")


def test_regex_and_ebnf_take_a_range_where_a_class_they_wait_for_does():
    hebrew = RegexGrammar("[\u05d0-\u05ea]+")
    assert hebrew.takes_one_of(hebrew.start, *HEBREW)
    assert not hebrew.takes_one_of(hebrew.start, "\u4e00", "\u4e3f")
    word, other = RegexGrammar(r"\w+"), RegexGrammar(r"\W+")  # ASCII classes: Arabic is \W
    assert not word.takes_one_of(word.start, "\u0640", "\u067f")
    assert other.takes_one_of(other.start, "\u0640", "\u067f")
    ebnf = EbnfGrammar('root ::= "a" [^\u05c0-\u05ff]')
    after_a = ebnf.step(ebnf.start, "a")
    assert not ebnf.takes_one_of(ebnf.start, *HEBREW)  # only "a" first
    assert not ebnf.takes_one_of(after_a, *HEBREW) and ebnf.takes_one_of(after_a, "\u4e00", "\u4e3f")


def test_plain_and_free_text_take_any_character_that_fits():
    name = JsonGrammar({"type": "string", "maxLength": 1})
    opened = name.step(name.start, '"')
    assert name.takes_one_of(opened, *HEBREW)
    assert not name.takes_one_of(name.step(opened, "x"), *HEBREW)  # its one character written
    assert not name.takes_one_of(name.start, *HEBREW)  # a value starts with '"', not a letter
    thinking = AfterThinking(RegexGrammar("[a-z]+"), closer="</think>")
    assert thinking.takes_one_of(thinking.start, *HEBREW)
    assert not thinking.takes_one_of(thinking.advance(thinking.start, "hm</think>"), *HEBREW)
    tags = StructuralTagGrammar({"structures": [{"begin": "<\u05e2>", "schema": {"type": "string"}, "end": "."}],
                                 "triggers": ["<"]})
    assert tags.takes_one_of(tags.start, "\u4e00", "\u4e3f")  # free text
    begun = tags.step(tags.start, "<")
    assert tags.takes_one_of(begun, *HEBREW) and not tags.takes_one_of(begun, "\u4e00", "\u4e3f")


def test_json_texts_written_exactly_take_their_next_character():
    """A declared key and an enum string go on only with their own next character: U+05DD
    (d7 9d) after U+05E9, so b"\\xd7" goes in and a CJK lead does not."""
    shin = "\u05e9\u05dd"
    for schema, text in (({"properties": {shin: {"type": "string"}}, "required": [shin]}, '{"\u05e9'),
                         ({"enum": [shin, "no"]}, '"\u05e9'), ({"const": shin}, '"\u05e9')):
        grammar = JsonGrammar(schema)
        state = grammar.advance(grammar.start, text)
        assert grammar.takes_one_of(state, *HEBREW) and not grammar.takes_one_of(state, "\u4e00", "\u4e3f")
        assert grammar.advance_bytes(state, b"", b"\xd7") == (state, b"\xd7")
        assert grammar.advance_bytes(state, b"\xd7", b"\x9d")[1] == b""
        assert grammar.advance_bytes(state, b"\xd7", b"\xa2") is None  # U+05E2: not the key's


def test_advance_bytes_carries_a_character_begun_until_it_ends():
    grammar = RegexGrammar("\u05e2\u05e9")  # UTF-8: d7 a2, d7 a9
    state, pending = grammar.advance_bytes(grammar.start, b"", b"\xd7")
    assert pending == b"\xd7" and state == grammar.start
    state, pending = grammar.advance_bytes(state, pending, b"\xa2\xd7")
    assert pending == b"\xd7" and state == grammar.advance(grammar.start, "\u05e2")
    assert grammar.advance_bytes(state, pending, b"\xa2") is None  # U+05E2 again: not allowed
    assert grammar.advance_bytes(state, b"", b"\xa9") is None  # no character starts so
    end, pending = grammar.advance_bytes(state, pending, b"\xa9")
    assert pending == b"" and grammar.is_complete(end)


def test_sentencepiece_byte_fallback_tokens_are_spelled_by_their_hex():
    """A Llama-2-style vocabulary: "\u05e2" has no token of its own, so it is written as <0xD7>
    <0xA2>, its UTF-8 bytes; "\ufffd" itself has one, and decodes as what it is."""
    vocab = {"<unk>": 0, "</s>": 1, "\u2581": 2, "a": 3, "\ufffd": 4, "<0xD7>": 5, "<0xA2>": 6, "<0x41>": 7}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = TextTokenizer(backend, TokenizerInfo(eos_token="</s>"))
    assert tokenizer.encode("a\u05e2", add_special_tokens=False) == [3, 5, 6]
    texts = appended_texts(tokenizer)
    assert texts[3:8] == ["a", None, None, None, "A"]
    assert byte_spellings(tokenizer, texts) == {4: "\ufffd".encode(), 5: b"\xd7", 6: b"\xa2"}

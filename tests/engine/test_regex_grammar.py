"""The regex recognizer against the `regex` package, the reference: a text is complete exactly
when the pattern matches it whole (`fullmatch`), and viable exactly when some longer text could
be matched whole (`fullmatch(..., partial=True)`), for patterns drawn at random from the syntax
the recognizer takes; both with ASCII classes (\\d is [0-9]), over an alphabet on which a class's
ASCII and Unicode readings agree. Where they differ, the recognizer takes a character only where
Python's `re` takes it under both (test_a_class_takes_a_character_only_where_both_readings_do)."""

from __future__ import annotations

import random
import re

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.engine.guided.regex_grammar import RegexError, RegexGrammar

ALPHABET = "ab0 9-.\n\u00e9Z_]"
atoms = st.sampled_from(["a", "b", "0", r"\d", r"\w", r"\s", r"\D", ".", "[a-b]", "[^a0]", r"[\]9]",
                         r"\.", r"\-", "\u00e9", r"\x5a", "[ _]", r"\n"])


def _quantified(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # no lazy quantifiers: the regex package's partial matches get them wrong (a*?a takes "ab")
    quantifier = st.sampled_from(["", "", "*", "+", "?", "{2}", "{0,2}", "{1,}", "{,2}"])
    return st.tuples(inner, quantifier).map(lambda t: f"(?:{t[0]}){t[1]}" if t[1] else t[0])


patterns = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(_quantified(inner), min_size=1, max_size=3).map("".join),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")"),
        inner.map(lambda x: f"(?:{x})"),
    ),
    max_leaves=6)


def _agrees(pattern: str, text: str) -> None:
    grammar = RegexGrammar(pattern)
    state = grammar.advance(grammar.start, text)
    assert grammar.is_complete(state) == (regex.fullmatch(pattern, text, flags=regex.ASCII) is not None), (pattern, text)
    assert (state is not None) == (regex.fullmatch(pattern, text, partial=True, flags=regex.ASCII) is not None), (pattern, text)


@settings(max_examples=300, deadline=None)
@given(patterns, st.randoms())
def test_random_patterns_match_and_begin_matches_as_the_regex_package_says(pattern, rng):
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(8))) for _ in range(25)]
    for text in texts:
        _agrees(pattern, text)


@settings(max_examples=100, deadline=None)
@given(patterns, st.randoms())
def test_random_walks_end_in_matches_and_never_dead_end(pattern, rng):
    grammar = RegexGrammar(pattern)
    state, text = grammar.start, ""
    for _ in range(12):
        options = [ch for ch in ALPHABET if grammar.step(state, ch) is not None]
        assert options or grammar.is_complete(state), (pattern, text)
        if not options or (grammar.is_complete(state) and rng.random() < 0.3):
            break
        text += rng.choice(options)
        state = grammar.step(state, text[-1])
        assert regex.fullmatch(pattern, text, partial=True, flags=regex.ASCII), (pattern, text)
    assert grammar.is_complete(state) == (regex.fullmatch(pattern, text, flags=regex.ASCII) is not None)


HAND_CASES = [  # what users write, and Python's readings of classes (ASCII) and escapes
    (r"\d{3}-\d{4}", ["555-1234", "555-123", "5551234", "555-12345", "٣٣٣-٣٣٣٣"]),
    (r"^(yes|no|maybe)!?$", ["yes", "no!", "maybe!!", "ye", "yesno"]),
    (r"[A-Z][a-z]+( [A-Z][a-z]+)*", ["Ada Lovelace", "Ada lovelace", "Ada ", "A"]),
    (r"(ab|a)*c", ["ababac", "aac", "abc", "abbc", "c"]),
    (r"\w+@\w+\.(com|org)", ["me@x.org", "me@x.net", "é@ü.com", "@x.com"]),
    (r"x{0,3}y{2,}", ["yy", "xxxyyy", "xxxxyy", "xy"]),
    (r"[^\s]{2,4}", ["ab", "a b", "abcde", "é\t"]),
    (r"\u00e9+\x41", ["ééA", "A", "é"]),
    (r"(?P<hex>[0-9a-f]+)h", ["ffh", "fgh", "h"]),
    (r".+", ["any thing", "line\nbreak"]),
    (r"a{,2}b", ["b", "aab", "aaab"]),
    (r"[\]a-]+", ["]-a", "b"]),
]


@pytest.mark.parametrize(("pattern", "texts"), HAND_CASES)
def test_hand_cases_agree_with_the_regex_package(pattern, texts):
    for text in texts:
        for cut in range(len(text) + 1):
            _agrees(pattern, text[:cut])


@pytest.mark.parametrize(("lazy", "greedy"), [(r"a*?a", r"a*a"), (r"(ab)+?c", r"(ab)+c"),
                                              (r"x{1,3}?y", r"x{1,3}y"), (r"\d??\.", r"\d?\.")])
def test_lazy_quantifiers_take_the_strings_greedy_ones_take(lazy, greedy):
    for text in ("", "a", "aa", "ab", "ababc", "abc", "xy", "xxxy", "xxxxy", "5.", ".", "55."):
        _agrees(greedy, text)
        lazy_grammar, greedy_grammar = RegexGrammar(lazy), RegexGrammar(greedy)
        lazy_state = lazy_grammar.advance(lazy_grammar.start, text)
        greedy_state = greedy_grammar.advance(greedy_grammar.start, text)
        assert (lazy_state is None) == (greedy_state is None), text
        assert lazy_grammar.is_complete(lazy_state) == greedy_grammar.is_complete(greedy_state), text


@pytest.mark.parametrize(("pattern", "words"), [
    (r"(a)\1", "backreference"),
    (r"(?=a)a", "lookaround"),
    (r"(?i)a", "flags"),
    (r"a^b", "anchors are taken only"),
    (r"\bword", "anchor"),
    (r"*a", "nothing to repeat"),
    (r"(a", "missing ')'"),
    (r"a)", "unbalanced ')'"),
    (r"[ab", "missing ']'"),
    ("a\\", "trailing backslash"),
    (r"a{3,1}", "bad repetition"),
    (r"\12", "\\12 (a backreference)"),  # two digits are a group's number, three octal ones a character
    (r"\477", "octal escape value"),
    (r"a++", "possessive"),
    (r"a**", "multiple repeat"),
    (r"(a{1000}){1000}", "too large"),
    (r"[z-a]", "bad character range"),
    ("", "non-empty string"),
    (r"[^\s\S]", "it matches no text"),  # the guide could only force an end (once: "stop")
    (r"a[^\s\S]", "it matches no text"),
    (r"(b|[^\d\D]a)*[^\d\D]", "it matches no text"),
])
def test_what_the_recognizer_does_not_take_is_refused_by_name(pattern, words):
    with pytest.raises(RegexError, match=regex.escape(words)):
        RegexGrammar(pattern)


def test_a_branch_no_character_matches_is_never_entered():
    """'a' could only start the dead branch, so it is refused at once rather than accepted into
    a text that cannot be finished; the live branch is untouched."""
    grammar = RegexGrammar(r"a[^\s\S]|b+")
    assert grammar.advance(grammar.start, "a") is None
    assert grammar.is_complete(grammar.advance(grammar.start, "bb"))


def test_many_texts_share_their_states():
    grammar = RegexGrammar(r"[a-z]+( [a-z]+)*")
    rng = random.Random(1)
    for _ in range(200):
        grammar.advance(grammar.start, "".join(rng.choice("abc ") for _ in range(6)))
    states = {state for state in grammar._memo.values() if state is not None}
    assert len(states) <= 3  # inside a word, after a space, ... however long the text


@pytest.mark.parametrize(("pattern", "texts"), [
    (r"a{}", ["a{}", "a", ""]),  # "{}" is text to Python, "{,}" is *
    (r"a{,}b", ["b", "aaab", "a{,}b"]),
    (r"x{}{2}", ["x{}}", "x{}", "xx"]),
    (r"{}", ["{}", ""]),
    (r"\177+", ["\x7f\x7f", "177", ""]),  # an octal escape: DEL
    (r"[\101-\103]\0", ["B\0", "D\0", "B"]),
    (r"\1010", ["A0", "A", "1010"]),
])
def test_braces_and_octal_escapes_read_as_python_reads_them(pattern, texts):
    grammar = RegexGrammar(pattern)
    for text in texts:
        assert grammar.is_complete(grammar.advance(grammar.start, text)) == bool(re.fullmatch(pattern, text)), text


CLASS_ATOMS = [r"\S", r"\W", r"\D", r"[^\s]", r"[^\w\d]", r"[\S\d]", r"\s", r"\w", r"\d", r"[\s\W]", "."]


@pytest.mark.parametrize("atom", CLASS_ATOMS)
def test_a_class_takes_a_character_only_where_both_readings_do(atom):
    """Python's Unicode reading (jsonschema's) takes whatever the recognizer takes: its \\S once
    took U+001F under ASCII alone, which Python's \\s holds a space; \\d, \\w and \\s stay ASCII's."""
    grammar = RegexGrammar(atom)
    for code in [*range(0x3100), *range(0xFE00, 0x10000), 0x1D7CE, 0x10FFFF]:
        ch = chr(code)
        both = bool(re.fullmatch(atom, ch)) and bool(re.fullmatch(atom, ch, re.ASCII))
        assert grammar.is_complete(grammar.advance(grammar.start, ch)) == both, (atom, hex(code))

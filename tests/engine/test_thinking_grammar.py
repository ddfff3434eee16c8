"""AfterThinking against Python's re: free text up to the first `</think>`, a few whitespace
characters, then the inner grammar; a text that never closes its thinking is whole too."""

from __future__ import annotations

import random
import re

import pytest

from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.thinking_grammar import AfterThinking

MARKER = "</think>"
# the reference: thinking without the marker, or up to its first occurrence, then the answer
REFERENCE = re.compile(r"(?s:(?:(?!</think>).)*)|(?s:(?:(?!</think>).)*</think>[ \t\r\n]{0,4}[0-9]+)")


# with Qwen3's opener: thinking only in a reply that opens with <think>, else the answer at once
OPTIONAL = re.compile(r"(?s:<think>(?:(?!</think>).)*)|(?s:<think>(?:(?!</think>).)*</think>"
                      r"[ \t\r\n]{0,4}[0-9]+)|[0-9]+")


def grammar(opener: str | None = None) -> AfterThinking:
    return AfterThinking(RegexGrammar("[0-9]+"), MARKER, opener)


def test_hand_cases():
    g = grammar()
    for text, whole in [("I think </thin k> more </think>\n\n42", True), ("<</think>5", True),
                        ("</t</think>5", True), ("still thinking", True), ("</think>", False),
                        ("</think>\n\n\n\n7", True)]:
        state = g.advance(g.start, text)
        assert state is not None and g.is_complete(state) == whole, text
    for dead in ["</think>x", "</think>\n\n\n\n\n7", "</think>7 ", "no </think> 12 </think> 3"]:
        assert g.advance(g.start, dead) is None, dead


@pytest.mark.parametrize(("opener", "reference"), [(None, REFERENCE), ("<think>", OPTIONAL)])
def test_random_texts_agree_with_re(opener, reference):
    """Texts from the markers' characters, digits, spaces and a letter: a text the grammar
    keeps alive is whole exactly when re matches it; a text it kills, re does not match."""
    g = grammar(opener)
    rng = random.Random(0)
    alphabet = list("</think>") + ["1", "2", " ", "\n", "x"]
    for _ in range(4000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        if rng.random() < 0.3:
            cut = rng.randint(0, len(text))
            text = text[:cut] + MARKER + text[cut:]
        if rng.random() < 0.4:
            text = "<think>" + text
        state = g.advance(g.start, text)
        expected = reference.fullmatch(text) is not None
        assert (state is not None and g.is_complete(state)) == expected, repr(text)


def test_an_opener_makes_thinking_optional():
    g = grammar("<think>")
    for text, whole in [("42", True), ("<think>hm</think>\n7", True), ("<think>hm", True),
                        ("<thi", False), ("", False)]:
        state = g.advance(g.start, text)
        assert state is not None and g.is_complete(state) == whole, text
    for dead in ["x", "<thx", "4<think>", "hm</think>7"]:
        assert g.advance(g.start, dead) is None, dead


def test_char_keys_group_characters_that_move_alike():
    g = grammar()
    states = [g.advance(g.start, t) for t in ["", "<", "</thi", "</thin", "</think>", "</think> ", "</think>4"]]
    for state in states:
        key = g.char_key(state)
        if key is None:
            continue
        chars = list("</thinkx>abc 09\n")
        for a in chars:
            for b in chars:
                if key(a) == key(b):
                    assert g.step(state, a) == g.step(state, b), (state, a, b)

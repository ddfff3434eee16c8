"""Random texts for the recognizer tests: edits of valid texts (near-misses a reference must
judge), and random walks through a recognizer (texts it calls complete, for the reference to
check; a walk asserts it never meets a state from which nothing goes on)."""

from __future__ import annotations

import random
import re

from inferlab.engine.guided.grammar import Grammar

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def whitespace_runs(text: str) -> list[str]:
    """The runs of JSON whitespace outside the strings of a JSON text."""
    return re.findall(r"[ \t\r\n]+", _JSON_STRING.sub('""', text))


def gaps_in_bounds(text: str) -> bool:
    """Every whitespace run outside the strings of a JSON text holds at most one line break
    ("\\n" or "\\r\\n", never a lone "\\r") and at most 20 spaces or tabs: how far the JSON
    recognizer lets a model pad."""
    for run in whitespace_runs(text):
        blanks = len(run) - run.count("\n") - run.count("\r")
        if run.count("\n") > 1 or run.count("\r") != run.count("\r\n") or blanks > 20:
            return False
    return True


def edit(text: str, rng: random.Random, alphabet: str) -> str:
    """`text` after one or two deletions, insertions or replacements of `alphabet`'s characters."""
    chars = list(text)
    for _ in range(rng.randrange(1, 3)):
        where = rng.randrange(len(chars) + 1)
        ch = rng.choice(alphabet)
        kind = rng.random()
        if kind < 0.3 and where < len(chars):
            del chars[where]
        elif kind < 0.7:
            chars.insert(where, ch)
        elif where < len(chars):
            chars[where] = ch
    return "".join(chars)


def walk(grammar: Grammar, rng: random.Random, budget: int, alphabet: list[str]) -> str | None:
    """Random characters of `alphabet` the recognizer takes until it calls the text complete
    (None: too long). Past `budget` characters it closes: no whitespace, and the characters
    that leave the fewest frames open (a state is a set of stacks)."""
    state, text = grammar.start, []
    while len(text) < 4 * budget:
        if grammar.is_complete(state) and (len(text) > budget or rng.random() < 0.2):
            return "".join(text)
        options = {ch: nxt for ch in alphabet if (nxt := grammar.step(state, ch)) is not None}
        assert options or grammar.is_complete(state), f"dead end after {''.join(text)!r}"
        if not options:
            return "".join(text)
        if len(text) > budget:
            options = {ch: nxt for ch, nxt in options.items() if not ch.isspace()} or options
            least = min(min(map(len, nxt)) for nxt in options.values())
            options = {ch: nxt for ch, nxt in options.items() if min(map(len, nxt)) == least}
        ch = rng.choice(sorted(options))
        text.append(ch)
        state = options[ch]
    return None


def finished_walks(grammar: Grammar, rng: random.Random, count: int, budget: int,
                   alphabet: list[str]) -> list[str]:
    """The texts of those of `count` walks that ended complete within 4 * budget characters."""
    texts = [walk(grammar, rng, budget, alphabet) for _ in range(count)]
    return [text for text in texts if text is not None]


def read_whole(grammar: Grammar, text: str) -> None:
    """Asserts the recognizer keeps every prefix of `text` alive and calls all of it complete."""
    state = grammar.start
    for i, ch in enumerate(text):
        state = grammar.step(state, ch)
        assert state is not None, text[: i + 1]
    assert grammar.is_complete(state), text


def complete(grammar: Grammar, text: str) -> bool:
    """The recognizer calls all of `text` complete."""
    return grammar.is_complete(grammar.advance(grammar.start, text))

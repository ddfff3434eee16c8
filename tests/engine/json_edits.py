"""Random edits of JSON texts, for the recognizer tests: near-misses a reference must judge."""

from __future__ import annotations

import random


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

"""Look a name up in a table; on a miss, one line naming the closest valid names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TypeVar

from inferlab.errors import InferlabError

T = TypeVar("T")


def closest_names(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` valid names close to `name`, compared case-insensitively."""
    by_lower = {v.lower(): v for v in valid}
    query = name.lower()
    # names that start with what was typed ("a100" -> A100-40GB) come before spelling neighbours
    prefixed = [v for v in by_lower if v.startswith(query)]
    similar = difflib.get_close_matches(query, list(by_lower), n=n, cutoff=0.5)
    hits = list(dict.fromkeys(prefixed + similar))[:n]
    return [by_lower[h] for h in hits]


def unknown_name_message(kind: str, name: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    close = closest_names(name, valid)
    hint = f"did you mean {', '.join(close)}?" if close else f"valid: {', '.join(valid)}"
    return f"unknown {kind} {name!r}; {hint}"


def lookup(table: Mapping[str, T], name: str, kind: str) -> T:
    """Case-insensitive lookup; raises InferlabError with the closest names on a miss."""
    for key, value in table.items():
        if key.lower() == name.lower():
            return value
    raise InferlabError(unknown_name_message(kind, name, table))

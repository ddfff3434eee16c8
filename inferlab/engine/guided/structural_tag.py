"""vLLM's structural tags (xgrammar's, `response_format` {"type": "structural_tag", ...}): free
text, in which each structure's `begin` text, once written, is followed by one JSON value its
`schema` takes and then its `end` text. The text is watched for `triggers`: once one is written,
the text goes on as the begin of a structure that starts with it, so a reply may call tools in
its own tags and stay free elsewhere.

    {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

Every begin must start with a trigger, and every trigger must start a begin. The JSON follows
its begin at once and the end follows the JSON at once (put a line break in the begin or end to
allow one); it is read as json_grammar.py reads JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from inferlab.engine.guided.grammar import Grammar, marker_tail
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import SchemaError
from inferlab.engine.utf8_tokens import SURROGATES

# A state is a frozenset of readings, the text read so far being ambiguous only where a value
# may end where its end text may begin:
#   ("free", t): free text, t its longest end that begins a trigger (a trigger not yet whole);
#   ("begin", t): t, a trigger and more, begins some structure's begin;
#   ("body", i, s): inside structure i's JSON, s its JsonGrammar state;
#   ("end", i, k): the first k characters of structure i's end read after its JSON.
Reading = tuple


@dataclass(frozen=True)
class Structure:
    begin: str
    schema: Any
    end: str


def parse_structural_tag(spec: Any) -> tuple[list[Structure], list[str]]:
    """(structures, triggers) of a structural tag; SchemaError names what is wrong."""
    if not isinstance(spec, dict) or not isinstance(spec.get("structures"), list) or not spec["structures"]:
        raise SchemaError('a structural tag is {"structures": [{"begin", "schema", "end"}, ...], '
                          '"triggers": [...]}')
    structures = []
    for item in spec["structures"]:
        if not (isinstance(item, dict) and isinstance(item.get("begin"), str) and item["begin"]
                and isinstance(item.get("end"), str) and "schema" in item):
            raise SchemaError('each structure is {"begin": text, "schema": JSON schema, "end": text}, '
                              "its begin not empty")
        structures.append(Structure(item["begin"], item["schema"], item["end"]))
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise SchemaError("triggers must be a non-empty list of non-empty texts")
    for text in [*triggers, *(part for s in structures for part in (s.begin, s.end))]:
        if SURROGATES.search(text):  # no token spells one: never written
            raise SchemaError(f"{text!r} holds a lone surrogate, which no text can")
    for s in structures:
        if not any(s.begin.startswith(t) for t in triggers):
            raise SchemaError(f"begin {s.begin!r} does not start with any trigger")
    for t in triggers:
        if not any(s.begin.startswith(t) for s in structures):
            raise SchemaError(f"trigger {t!r} starts no structure's begin")
    return structures, triggers


class StructuralTagGrammar(Grammar):
    def __init__(self, spec: Any) -> None:
        super().__init__()
        self.structures, self.triggers = parse_structural_tag(spec)
        self.bodies = [JsonGrammar(s.schema) for s in self.structures]
        self.start: frozenset[Reading] = frozenset({("free", "")})
        self._trigger_chars = frozenset("".join(self.triggers))
        self._trigger_starts = frozenset(t[0] for t in self.triggers)

    def _next(self, state: frozenset[Reading], ch: str) -> frozenset[Reading] | None:
        readings = {after for reading in state for after in self._read(reading, ch)}
        return frozenset(self._settle(readings)) if readings else None

    def _read(self, reading: Reading, ch: str) -> list[Reading]:
        kind = reading[0]
        if kind == "free":
            return self._free(reading[1] + ch)
        if kind == "begin":
            return self._begun(reading[1] + ch)
        i = reading[1]
        end = self.structures[i].end
        if kind == "end":
            k = reading[2]
            return [("end", i, k + 1)] if end[k] == ch else []
        body, state = self.bodies[i], reading[2]
        nxt = body.step(state, ch)
        out = [] if nxt is None else [("body", i, nxt)]
        if body.is_complete(state) and end and end[0] == ch:
            out.append(("end", i, 1))
        return out

    def _free(self, text: str) -> list[Reading]:
        """Free text ending in `text`: a trigger it ends with starts a begin (the longest, should
        two end here), even where a longer trigger is still partway; else the longest end of it
        that a trigger starts with is kept."""
        whole = [t for t in self.triggers if text.endswith(t)]
        if whole:
            return self._begun(max(whole, key=len))
        return [("free", marker_tail(text, self.triggers))]

    def _begun(self, text: str) -> list[Reading]:
        """Readings once `text`, a trigger and more, is written: a structure whose begin it is
        goes on to its JSON (a trigger may be a whole begin, as "<tool_call>" often is), and
        while it is the start of a longer begin that begin may still come."""
        out: list[Reading] = [("body", i, self.bodies[i].start)
                              for i, s in enumerate(self.structures) if s.begin == text]
        if any(s.begin.startswith(text) and s.begin != text for s in self.structures):
            out.append(("begin", text))
        return out

    def _settle(self, readings: set[Reading]) -> set[Reading]:
        """A structure whose end is read whole (or empty, after its JSON) is free text again."""
        settled = set()
        for r in readings:
            if r[0] == "end" and r[2] == len(self.structures[r[1]].end):
                r = ("free", "")
            elif r[0] == "body" and not self.structures[r[1]].end and self.bodies[r[1]].is_complete(r[2]):
                settled.add(("free", ""))
            settled.add(r)
        return settled

    def is_complete(self, state: frozenset[Reading] | None) -> bool:
        return state is not None and any(r[0] == "free" for r in state)

    def plain_text_room(self, state: frozenset[Reading]) -> float | None:
        if len(state) != 1:
            return None
        (reading,) = state
        if reading[0] != "body" or self.bodies[reading[1]].is_complete(reading[2]):
            return None
        return self.bodies[reading[1]].plain_text_room(reading[2])

    def moving_chars(self, state: frozenset[Reading]) -> frozenset[str] | None:
        """Free text with no trigger begun: only a trigger's first character moves it."""
        return self._trigger_starts if state == self.start else None

    def _takes_one_of(self, state: frozenset[Reading], lo: str, hi: str) -> bool:
        return any(self._reading_takes(reading, lo, hi) for reading in state)

    def _reading_takes(self, reading: Reading, lo: str, hi: str) -> bool:
        """Whether some character from lo to hi takes the reading on (see _read)."""
        kind = reading[0]
        if kind == "free":
            return True
        if kind == "begin":
            at = len(reading[1])
            return any(s.begin.startswith(reading[1]) and len(s.begin) > at and lo <= s.begin[at] <= hi
                       for s in self.structures)
        end = self.structures[reading[1]].end
        if kind == "end":
            return lo <= end[reading[2]] <= hi
        body, inner = self.bodies[reading[1]], reading[2]
        return body.takes_one_of(inner, lo, hi) or (body.is_complete(inner) and bool(end) and lo <= end[0] <= hi)

    def char_key(self, state: frozenset[Reading]) -> Callable[[str], Hashable] | None:
        if len(state) != 1 or next(iter(state))[0] != "free":
            return None
        trigger_chars = self._trigger_chars  # any other character leaves ("free", "")
        return lambda ch: ch if ch in trigger_chars else ""

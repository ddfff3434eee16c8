"""Objects that take other keys (additionalProperties) while a required key is still to come:
every state the recognizer reaches must be the start of some text it accepts, else guided
decoding writes a key that never closes until max_tokens. Checked by walking the recognizer
without a model: each reachable state must reach a complete one, and the finished texts must
validate against the schema (jsonschema, and the grammar's stricter rules: json_reference.py).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Hashable

import jsonschema
import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar

from .grammar_fuzz import complete, finished_walks
from .json_reference import reference_accepts

DECLARED_REQUIRED = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                     "additionalProperties": True}
UNDECLARED_REQUIRED = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["b"],
                       "additionalProperties": True}
OPTIONAL_FIRST = {"type": "object", "properties": {"x": {"type": "integer"}, "a": {"type": "boolean"}},
                  "required": ["a"], "additionalProperties": {"type": "string"}}
SCHEMAS = {"declared_required": DECLARED_REQUIRED, "undeclared_required": UNDECLARED_REQUIRED,
           "optional_first": OPTIONAL_FIRST}
# closing characters first, so that a search for a way to finish tries the short ones early
ALPHABET = list('"}:1true,{abx')


def completion(grammar: JsonGrammar, state: Hashable, budget: int = 3000) -> str | None:
    """A text over ALPHABET that takes `state` to a complete one, found by a depth-first search
    that tries closing characters first and gives up after `budget` states (from a state that
    can finish, it finds a way within a few dozen)."""
    seen: set[Hashable] = set()
    todo = [(state, "")]
    while todo and len(seen) < budget:
        state, text = todo.pop()
        if grammar.is_complete(state):
            return text
        if state in seen:
            continue
        seen.add(state)
        todo += [(nxt, text + ch) for ch in reversed(ALPHABET)  # the first character popped first
                 if (nxt := grammar.step(state, ch)) is not None]
    return None


def reachable(grammar: JsonGrammar, limit: int = 800) -> dict[Hashable, str]:
    """The first `limit` states a breadth-first walk over ALPHABET reaches, with a text to each."""
    found = {grammar.start: ""}
    queue = deque([grammar.start])
    while queue and len(found) < limit:
        state = queue.popleft()
        for ch in ALPHABET:
            nxt = grammar.step(state, ch)
            if nxt is not None and nxt not in found:
                found[nxt] = found[state] + ch
                queue.append(nxt)
    return found


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_reachable_state_can_still_finish(name):
    grammar = JsonGrammar(SCHEMAS[name])
    for state, text in reachable(grammar).items():
        rest = completion(grammar, state)
        assert rest is not None, f"no way found to finish {text!r}"
        assert reference_accepts(SCHEMAS[name], text + rest), text + rest


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_walks_finish_in_texts_the_schema_validates(name):
    schema = SCHEMAS[name]
    texts = finished_walks(JsonGrammar(schema), random.Random(name), 40, budget=30, alphabet=ALPHABET)
    assert len(texts) >= 35
    for text in texts:
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), text
        assert reference_accepts(schema, text), text
    assert any(set(json.loads(t)) - set(schema["properties"]) - set(schema["required"])
               for t in texts)  # other keys were written too


def test_a_required_key_outside_properties_can_be_written_and_must_be():
    grammar = JsonGrammar(UNDECLARED_REQUIRED)
    for text, whole in (('{"b":1}', True), ('{"a":true,"b":[]}', True), ('{"b":null,"c":"d"}', True),
                        ('{"a":true}', False), ("{}", False), ('{"c":1,"b":2}', False),
                        ('{"b":1,"a":true}', False)):  # declared keys in order, others after
        assert complete(grammar, text) == whole, text
    assert grammar.advance(grammar.start, '{"c') is None  # not a key that may come before "b"


def test_a_key_that_cannot_become_an_allowed_one_is_refused_at_once():
    grammar = JsonGrammar(DECLARED_REQUIRED)
    assert grammar.advance(grammar.start, '{"t') is None  # only "a" may come first
    assert complete(grammar, '{"a":false,"t":{"u":[1]}}')
    assert not complete(grammar, '{"t":1,"a":true}')

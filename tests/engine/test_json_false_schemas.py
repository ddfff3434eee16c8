"""Subschemas built of false alone (json_false_schemas.py): which $refs take nothing is found
once a reference, whatever the order of the schema's $defs or properties."""

from __future__ import annotations

import pytest

from inferlab.engine.guided import json_false_schemas, json_schema
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import compile_schema

from .grammar_fuzz import complete


def test_a_chain_of_shared_references_is_read_once_a_reference(monkeypatch):
    """Each level an anyOf of the next level twice, the last false: the false-alone check once
    read every path, twice as many a level (40 levels: 2**40 reads); now each $ref once."""
    levels, reads = 40, []
    resolve = json_schema._Compiler.resolve

    def counted(self, pointer):
        reads.append(pointer)
        assert len(reads) <= 10 * levels, "the references are read again and again"
        return resolve(self, pointer)

    monkeypatch.setattr(json_schema._Compiler, "resolve", counted)
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(levels)}
    compile_schema({"$defs": {**defs, f"d{levels}": False}, "type": "object",
                    "properties": {"a": {"$ref": "#/$defs/d0"}, "b": {"type": "integer"}}})
    assert len(reads) == len(set(reads)) == levels + 1


@pytest.mark.parametrize("reverse", [False, True])
def test_a_long_chain_of_references_is_read_a_bounded_number_of_times(monkeypatch, reverse):
    """d0 -> d1 -> ... -> d300 -> false, the $defs in either order: a round-by-round fixpoint
    once turned one answer a round, 300 rounds of 300 reads (a 214 KB schema of 6,000 froze
    the server for 24 s); now a reference is read again only when one it reads turns."""
    levels, reads = 300, []
    takes_nothing = json_false_schemas.takes_nothing

    def counted(schema, refs):
        reads.append(1)
        return takes_nothing(schema, refs)

    monkeypatch.setattr(json_false_schemas, "takes_nothing", counted)
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(levels)} | {f"d{levels}": False}
    defs = dict(reversed(defs.items())) if reverse else defs
    grammar = JsonGrammar({"$defs": defs, "type": "object",
                           "properties": {"a": {"$ref": "#/$defs/d0"}, "b": {"type": "integer"}}})
    assert complete(grammar, '{"b":1}') and not complete(grammar, '{"a":1}')
    assert len(reads) <= 10 * levels


@pytest.mark.parametrize("order", [("x", "c"), ("c", "x")])
def test_whether_a_reference_takes_nothing_does_not_depend_on_the_property_order(order):
    """X is allOf [C, false], C anyOf [false, X]: both take nothing, as each is built of false
    alone. The check once stored C's answer while X was still being read (taking X for
    something), so with x named first c was compiled and refused ("every branch of anyOf")."""
    defs = {"X": {"allOf": [{"$ref": "#/$defs/C"}, False]},
            "C": {"anyOf": [False, {"$ref": "#/$defs/X"}]}}
    grammar = JsonGrammar({"$defs": defs, "type": "object",
                           "properties": {key: {"$ref": f"#/$defs/{key.upper()}"} for key in order}})
    assert complete(grammar, "{}")
    assert not complete(grammar, '{"x":1}') and not complete(grammar, '{"c":1}')

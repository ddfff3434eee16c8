"""Triggers that are whole begins, as "<tool_call>" is both in the common tool-call tag: once
written, the structure's JSON follows at once; and a trigger that is one begin whole and the
start of another leaves both open. Judged by test_structural_tag's reference, written from the
definition."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.engine.guided.structural_tag import StructuralTagGrammar

from .grammar_fuzz import complete, read_whole
from .test_structural_tag import reference

SUM = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL_CALL = {"structures": [{"begin": "<tool_call>", "schema": SUM, "end": "</tool_call>"}],
             "triggers": ["<tool_call>"]}
HELLO = {"structures": [{"begin": "Hello", "schema": SUM, "end": "!"}], "triggers": ["Hello"]}
# "<f" is the first structure's begin whole and the start of the second's
SHARED = {"structures": [{"begin": "<f", "schema": {"type": "integer"}, "end": ">"},
                         {"begin": "<f=w>", "schema": SUM, "end": "</f>"}],
          "triggers": ["<f"]}


@pytest.mark.parametrize(("spec", "text", "whole"), [
    (TOOL_CALL, 'hi <tool_call>{"a": 1}</tool_call> bye', True),
    (TOOL_CALL, '<tool_call>{"a": 1}</tool_call><tool_call>{"a": 2}</tool_call>', True),
    (TOOL_CALL, "no call here, <tool_ nor here", True),
    (TOOL_CALL, '<tool_call>{"a": 1}', False),
    (TOOL_CALL, "<tool_call> and prose", False),
    (HELLO, 'Hello{"a": 7}!', True),
    (HELLO, 'Hi there. Hello{"a": -3}! Bye', True),
    (HELLO, "Hello", False),
    (HELLO, "Hello world", False),
    (SHARED, "<f12>", True),
    (SHARED, '<f=w>{"a": 1}</f>', True),
    (SHARED, '<f-2> then <f=w>{"a": 3}</f>', True),
    (SHARED, "<f=x>", False),
    (SHARED, "<f", False),
    (SHARED, "<f=w>", False),
])
def test_a_trigger_that_is_a_whole_begin_goes_on_to_the_json(spec, text, whole):
    assert complete(StructuralTagGrammar(spec), text) == whole == reference(spec, text)


@pytest.mark.parametrize(("spec", "text"), [
    (TOOL_CALL, 'hi <tool_call>{"a": 1}</tool_call>'),
    (HELLO, 'Hello{"a": 7}!'),
    (SHARED, '<f=w>{"a": 1}</f><f5>'),
])
def test_no_prefix_of_a_whole_text_is_refused(spec, text):
    read_whole(StructuralTagGrammar(spec), text)


PIECES = ["<f7>", '<f=w>{"a": 1}</f>', "<f", "<", "=w>", "=x>", ">", "12", "-", '{"a": 1}', "</f>", " ", "x"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=8))
def test_texts_around_a_shared_trigger_are_whole_exactly_when_the_definition_says(parts):
    text = "".join(parts)
    assert complete(StructuralTagGrammar(SHARED), text) == reference(SHARED, text), text

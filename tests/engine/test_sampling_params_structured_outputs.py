"""vLLM's grouped guide, SamplingParams(structured_outputs=StructuredOutputsParams(...)) and its
older guided_decoding=GuidedDecodingParams(...): the same guide as SamplingParams' own field for
it, and vLLM's rules (one kind of guide at most) with unknown or unsupported fields refused by
name. The outputs match the separate fields' in engine_e2e/test_sampling.py."""

from __future__ import annotations

import dataclasses
import re

import pytest

import inferlab
from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.structured_outputs import GuidedDecodingParams, StructuredOutputsParams
from inferlab.errors import InvalidParameterError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TAG = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]}
# (vLLM's grouped field, its value) -> SamplingParams' own field with the same guide
SAME_GUIDE = [
    ({"choice": ["yes", "no"]}, {"guided_choice": ["yes", "no"]}),
    ({"regex": "[0-9]{3}"}, {"guided_regex": "[0-9]{3}"}),
    ({"grammar": 'root ::= "a" | "b"'}, {"guided_grammar": 'root ::= "a" | "b"'}),
    ({"json": SCHEMA}, {"json_schema": SCHEMA}),
    ({"json": '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'},
     {"json_schema": SCHEMA}),  # vLLM takes the schema's text too
    ({"json_object": True}, {"json_object": True}),
    ({"json_object": True, "disable_any_whitespace": True},
     {"json_object": True, "disable_any_whitespace": True}),
    ({"structural_tag": TAG}, {"structural_tag": TAG}),
    ({"structural_tag": '{"structures": [{"begin": "<f>", "schema": {"type": "object", "properties": '
                        '{"a": {"type": "integer"}}, "required": ["a"]}, "end": "</f>"}], "triggers": ["<f>"]}'},
     {"structural_tag": TAG}),
]


def _guide(params: SamplingParams) -> tuple:
    return params.guided_by, params.guided_choice, params.grammar


@pytest.mark.parametrize(("grouped", "separate"), SAME_GUIDE)
def test_a_grouped_guide_is_the_separate_field_s_guide(grouped, separate):
    reference = _guide(SamplingParams(max_tokens=5, **separate))
    assert _guide(SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(**grouped))) == reference
    assert _guide(SamplingParams(max_tokens=5, structured_outputs=grouped)) == reference  # a dict
    assert _guide(SamplingParams(max_tokens=5, guided_decoding=GuidedDecodingParams(**grouped))) == reference
    assert _guide(SamplingParams(max_tokens=5, guided_decoding=grouped)) == reference


def test_the_tester_s_vllm_call_is_taken():
    params = SamplingParams(max_tokens=5, structured_outputs={"choice": ["a", "b"]})
    assert (params.guided_by, params.guided_choice) == ("guided_choice", ["a", "b"])


def test_a_copy_keeps_the_guide_without_giving_it_twice():
    params = SamplingParams(structured_outputs={"regex": "[ab]"})
    copied = dataclasses.replace(params, max_tokens=3)  # runs __post_init__ again
    assert (copied.guided_regex, copied.max_tokens) == ("[ab]", 3)


def test_the_names_are_exported_beside_sampling_params():
    assert inferlab.StructuredOutputsParams is StructuredOutputsParams
    assert inferlab.GuidedDecodingParams is StructuredOutputsParams
    assert "StructuredOutputsParams" in inferlab.__all__ and "GuidedDecodingParams" in inferlab.__all__


@pytest.mark.parametrize(("fields", "words"), [
    # vLLM's rule: one kind of guide, json_object=False counted as given
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}},
     "StructuredOutputsParams takes one kind of guide, got regex and choice"),
    ({"structured_outputs": {"json": SCHEMA, "json_object": False}},
     "StructuredOutputsParams takes one kind of guide, got json and json_object"),
    ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "a"},
     "structured_outputs cannot be combined with guided_regex: give the guide one way"),
    ({"guided_decoding": {"json_object": True}, "json_schema": SCHEMA},
     "guided_decoding cannot be combined with json_schema: give the guide one way"),
    ({"structured_outputs": {"choice": ["a"]}, "guided_decoding": {"choice": ["a"]}},
     "structured_outputs and guided_decoding (its older name) cannot be combined"),
    ({"structured_outputs": {"choise": ["a"]}}, "structured_outputs has no field 'choise' "
     "(StructuredOutputsParams has json, regex, choice"),
    ({"guided_decoding": {"regex": "a", "guided_regex": "a"}}, "guided_decoding has no field 'guided_regex'"),
    ({"structured_outputs": {"regex": "a", "backend": "xgrammar"}},
     "StructuredOutputsParams backend is not supported by inferlab's guides (leave it None)"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}},
     "StructuredOutputsParams whitespace_pattern is not supported"),
    ({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
     "StructuredOutputsParams disable_additional_properties is not supported"),
    ({"structured_outputs": ["choice"]}, "structured_outputs must be a StructuredOutputsParams or a dict"),
    ({"structured_outputs": {"json_object": "yes"}}, "json_object must be true or false, got 'yes'"),
    ({"structured_outputs": {"json": "{not json"}}, "StructuredOutputsParams json: the text is not JSON"),
    ({"structured_outputs": {"choice": ["a"]}, "ignore_eos": True}, "cannot be combined with ignore_eos"),
])
def test_what_vllm_or_inferlab_refuses_is_refused_by_name(fields, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        SamplingParams(**fields)


def test_disable_fallback_is_taken_as_there_is_nothing_to_fall_back_to():
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a", disable_fallback=True))
    assert params.guided_regex == "a"

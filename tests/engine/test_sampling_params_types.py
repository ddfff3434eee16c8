"""Fields of the wrong type are refused by name (a bare number for a list field too); token ids
and biases given as numpy numbers are taken as the numbers they are (they were refused as out of
range); a bool is not a bias; vLLM's seed=-1 is no seed."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError


def test_numpy_and_torch_ids_and_biases_become_python_numbers():
    params = SamplingParams(logit_bias={np.int64(5): np.float32(3.0)},
                            allowed_token_ids=list(np.array([5, 6])),
                            stop_token_ids=list(np.array([7], dtype=np.int32)))
    assert params.logit_bias == {5: 3.0} and type(next(iter(params.logit_bias))) is int
    assert params.allowed_token_ids == [5, 6] and type(params.allowed_token_ids[0]) is int
    assert params.stop_token_ids == [7] and type(params.stop_token_ids[0]) is int


@pytest.mark.parametrize(("fields", "words"), [
    ({"logit_bias": {5: True}}, "logit_bias values must be numbers in [-100, 100], got True"),
    ({"logit_bias": {5: np.float32(300)}}, "logit_bias values must be numbers in [-100, 100]"),
    ({"logit_bias": {np.float64(5.0): 1.0}}, "logit_bias keys must be token ids"),
    ({"allowed_token_ids": [np.int64(-1)]}, "allowed_token_ids must be a non-empty list"),
])
def test_what_is_still_no_token_id_or_bias(fields, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        SamplingParams(**fields)


@pytest.mark.parametrize("penalty", [0.0, -1.0, math.inf, math.nan])
def test_a_repetition_penalty_is_a_finite_positive_number(penalty):
    # inf divided positive logits to 0 and multiplied a logit of exactly 0 into NaN
    with pytest.raises(InvalidParameterError, match="repetition_penalty must be a finite number > 0"):
        SamplingParams(repetition_penalty=penalty)


@pytest.mark.parametrize(("fields", "words"), [
    ({"seed": True}, "seed must be an integer, got True"),  # once failed mid-step in the generator
    ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"logprobs": 1.5}, "logprobs must be an integer"),  # once failed mid-step in topk
    ({"prompt_logprobs": 2.0}, "prompt_logprobs must be an integer"),
    ({"n": 2.5}, "n must be an integer"),
    ({"max_tokens": 2.5}, "max_tokens must be an integer"),  # once gave 3 tokens
    ({"top_k": math.inf}, "top_k must be an integer"),
    ({"temperature": "1"}, "temperature must be a number"),
    ({"top_p": True}, "top_p must be a number"),
    ({"stop": [1]}, "stop must be non-empty strings"),  # once left a request no step could serve
    ({"stop": ["Paris"], "detokenize": False}, "stop strings need detokenize"),  # once ignored
    ({"bad_words": [3]}, "bad_words must be strings"),
    ({"ignore_eos": "no"}, "ignore_eos must be true or false, got 'no'"),  # once ignored EOS
    ({"logit_bias": [1, 2]}, "logit_bias must be a mapping of token ids to biases"),  # a TypeError
])
def test_fields_of_the_wrong_type_are_refused_by_name(fields, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        SamplingParams(**fields)


def test_numpy_values_pass_as_python_ones():
    """Its ints and floats are numbers.Integral and Real; its bools are not Python's, and were
    refused (found by a reviewer)."""
    params = SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.5), ignore_eos=np.True_)
    assert params.ignore_eos and params.max_tokens == 3


@pytest.mark.parametrize("name", ["stop", "stop_token_ids", "bad_words", "allowed_token_ids",
                                  "guided_choice"])
def test_a_number_for_a_list_field_is_refused_naming_the_field(name):
    """list(5) once raised a bare TypeError ('int' object is not iterable) before the checks."""
    with pytest.raises(InvalidParameterError, match=f"^{name} must be a list, got 5$"):
        SamplingParams(**{name: 5})


def test_lists_given_as_one_string_or_any_iterable_are_still_taken():
    params = SamplingParams(stop="END", stop_token_ids=(7, 8), bad_words="bad")
    assert (params.stop, params.stop_token_ids, params.bad_words) == (["END"], [7, 8], ["bad"])


def test_seed_minus_one_is_no_seed_as_in_vllm():
    """vLLM's SamplingParams.__post_init__: `if self.seed == -1: self.seed = None`."""
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=-1, n=3).seed is None
    assert SamplingParams(seed=-2).seed == -2  # any other seed is a seed

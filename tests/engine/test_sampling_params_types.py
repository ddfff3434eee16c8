"""Token ids and biases given as numpy numbers are taken as the numbers they are
(they were refused as out of range); a bool is not a bias."""

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

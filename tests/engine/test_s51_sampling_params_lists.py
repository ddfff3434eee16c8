"""SamplingParams' list fields given a bare number, and vLLM's seed=-1."""

from __future__ import annotations

import pytest

from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError


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

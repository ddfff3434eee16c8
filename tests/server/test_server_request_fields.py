"""Fields of a completions request held to vLLM: spaces_between_special_tokens false (which
vLLM's fast detokenizer honours only for a joining decoder), the order of stop strings, and
seed -1 (no seed)."""

from __future__ import annotations

import re

import pytest
from server_helpers import MODEL_NAME
from test_server_errors import post

IM_START, IM_END = 1, 2  # the embedded SmolLM2's special tokens


def complete(server, **fields) -> dict:
    r = post(server, "/v1/completions", json={"model": MODEL_NAME, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_spaces_between_special_tokens_false_is_served_as_vllm_serves_it(server, skip_special_tokens):
    """Only special tokens may be sampled: vLLM's fast detokenizer writes each one after
    another as its own text, no space between (as the byte-level decoder does anyway), so the
    text is the same as without the field."""
    fields = {"prompt": "Hi", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
              "allowed_token_ids": [IM_START, IM_END], "skip_special_tokens": skip_special_tokens}
    plain = complete(server, **fields)["text"]
    assert complete(server, **fields, spaces_between_special_tokens=False)["text"] == plain
    if skip_special_tokens:
        assert plain == ""
    else:
        assert re.fullmatch(r"(<\|im_(start|end)\|>){6}", plain), plain


@pytest.mark.parametrize("first", [True, False])
def test_of_stop_strings_ending_together_the_first_listed_wins(server, first):
    """vLLM's check_stop_strings returns the first of the list found in the new text: " city"
    and "e city" both end with the token " city"."""
    fields = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    full = complete(server, **fields)["text"]
    at = full.index("e city")
    assert full.index(" city") == at + 1  # neither is found before the other's end
    stop = [" city", "e city"] if first else ["e city", " city"]
    choice = complete(server, **fields, stop=stop)
    assert (choice["text"], choice["stop_reason"]) == ((full[:at + 1], " city") if first else
                                                       (full[:at], "e city"))


def test_seed_minus_one_samples_unseeded(server):
    """vLLM maps seed -1 to None; as a seed, four answers at temperature 1 were one text."""
    fields = {"prompt": "My favourite animal is", "max_tokens": 12, "temperature": 1.0, "seed": -1}
    texts = {complete(server, **fields)["text"] for _ in range(4)}
    assert len(texts) > 1


@pytest.mark.parametrize("field, value", [("spaces_between_special_tokens", "no"),
                                          ("parallel_tool_calls", 1)])
def test_a_served_field_of_the_wrong_type_is_named_as_such(server, field, value):
    """Not "not supported by this server": the field is served, its value is the mistake."""
    r = post(server, "/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", field: value})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["message"], error["param"]) == (f"'{field}' must be true or false, got {value!r}", field)

"""BeamSearch's rounds on hand-made engine answers: which candidates go on, which finish, and
how the answer is ranked, each worked out by hand."""

from __future__ import annotations

import math
import re

import pytest

from inferlab.engine.beam_search import BeamSearch, BeamSearchParams
from inferlab.engine.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from inferlab.errors import ContextLengthError, InvalidParameterError

EOS = 0


def answer(top: list[tuple[int, float]]) -> RequestOutput:
    """An engine output of one token whose top candidates are `top` (token, logprob)."""
    step = TokenLogprobs(top[0][0], top[0][1], 1, top)
    return RequestOutput("r", None, [], [CompletionOutput(0, "", [top[0][0]], "length",
                                                          logprobs=[step])], True)


class Letters:
    """A tokenizer whose token t spells the letter chr(ord('a') + t - 1)."""

    @staticmethod
    def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t - 1) for t in ids)

    @staticmethod
    def text(token_id: int) -> str:  # a token's text alone, as the engine's decoded_token
        return Letters.decode([token_id])


def test_end_tokens_finish_and_the_next_candidates_take_their_place():
    """Width 2, so 4 candidates a beam: EOS is the best candidate of the prompt, and finishes;
    the two best others go on. Round two: from a, "a c" (-0.5 - 0.2) and "a EOS" (-0.5 - 0.3)
    and from b, "b d" (-0.7 - 0.1): the best two that go on are "a c" and "b d"."""
    search = BeamSearch([5, 6], BeamSearchParams(beam_width=2, max_tokens=2), {EOS}, 64)
    search.advance([answer([(EOS, -0.1), (1, -0.5), (2, -0.7), (3, -2.0)])])
    assert search.beams() == [[5, 6, 1], [5, 6, 2]]
    search.advance([answer([(3, -0.2), (EOS, -0.3), (4, -1.0), (2, -3.0)]),
                    answer([(4, -0.1), (1, -1.5), (EOS, -2.0), (3, -2.5)])])
    assert search.done and search.beams() == [[5, 6, 1, 3], [5, 6, 2, 4]]
    # scores, length with the prompt and without an ending EOS: "EOS" -0.1/2, "a EOS" -0.8/3,
    # "a c" -0.7/4, "b d" -0.8/4, "b EOS" -2.7/3: the best two are "EOS" and "a c"
    out = search.output("r", Letters(), None, Letters.text)
    assert [(c.token_ids, c.text, c.finish_reason) for c in out.outputs] == [
        ([EOS], "", "stop"), ([1, 3], "ac", "length")]
    assert math.isclose(out.outputs[1].cumulative_logprob, -0.7)


def test_include_stop_str_in_output_keeps_the_end_tokens_text():
    """vLLM's field: the finished beam "a EOS" reads "a" without it and "a@" with it (EOS, token
    0, spells chr(ord('a') - 1) = '`' here); temperature, vLLM's other field, is taken."""
    def texts(include: bool) -> list[str]:
        params = BeamSearchParams(beam_width=1, max_tokens=2, temperature=0.7,
                                  include_stop_str_in_output=include)
        search = BeamSearch([5], params, {EOS}, 64)
        search.advance([answer([(1, -0.1), (2, -3.0)])])
        search.advance([answer([(EOS, -0.1), (3, -3.0)])])
        return [c.text for c in search.output("r", Letters(), None, Letters.text).outputs]

    assert texts(False) == ["a"]
    assert texts(True) == ["a`"]
    with pytest.raises(InvalidParameterError, match="temperature must be a finite number >= 0"):
        BeamSearchParams(beam_width=1, temperature=-1.0)


def test_a_prompt_that_fills_the_context_is_refused_for_no_room_not_a_max_tokens_it_lacks():
    """Without max_tokens it once said "max_tokens is -1", a value nobody gave."""
    with pytest.raises(ContextLengthError) as e:
        BeamSearch([5] * 9, BeamSearchParams(beam_width=2), {EOS}, 8)
    assert str(e.value) == "the prompt has 9 tokens, the context holds 8: no room for output"
    with pytest.raises(ContextLengthError) as e:
        BeamSearch([5] * 6, BeamSearchParams(beam_width=2, max_tokens=3), {EOS}, 8)
    assert str(e.value) == "prompt (6 tokens) + max_tokens (3) = 9 is over the context length 8"


def test_length_penalty_decides_between_short_and_long():
    """One finished beam of 1 token (-0.4 + EOS -0.2 = -0.6, length 3 with the prompt) against a
    live one of 2 tokens (-0.4 - 0.5 = -0.9, length 4). Penalty 1: -0.2 against -0.225, the
    short one first; penalty 3: -0.6/27 = -0.0222 against -0.9/64 = -0.0141, the long one."""
    def ranked(penalty: float) -> list[list[int]]:
        search = BeamSearch([7, 8], BeamSearchParams(beam_width=1, max_tokens=2,
                                                     length_penalty=penalty), {EOS}, 64)
        search.advance([answer([(1, -0.4), (2, -3.0)])])
        search.advance([answer([(EOS, -0.2), (3, -0.5)])])
        return [c.token_ids for c in search.output("r", Letters(), None, Letters.text).outputs]

    assert ranked(1.0) == [[1, EOS]]
    assert ranked(3.0) == [[1, 3]]
    # powers past a float's range (they once failed the request): at +1000, -0.9 / 4**1000 is
    # nearer 0 than -0.6 / 3**1000, the long one first; at -1000, -0.6 * 3**1000 is, the short
    assert ranked(1000.0) == [[1, 3]]
    assert ranked(-1000.0) == [[1, EOS]]
    for penalty in (math.inf, math.nan, 1e17, -2e6):  # 1e17 once ranked the beams by chance
        with pytest.raises(InvalidParameterError, match=r"length_penalty must be a number from "
                                                         r"-1e\+06 to 1e\+06"):
            BeamSearchParams(beam_width=1, length_penalty=penalty)


@pytest.mark.parametrize(("fields", "words"), [
    ({"beam_width": "2"}, "beam_width must be an integer, got '2'"),  # a TypeError in a compare
    ({"beam_width": True}, "beam_width must be an integer, got True"),  # ran as one beam
    ({"max_tokens": 2.5}, "max_tokens must be an integer, got 2.5"),  # ran a third round
    ({"logprobs": 1.5}, "logprobs must be an integer, got 1.5"),  # a TypeError mid-search
    ({"ignore_eos": "no"}, "ignore_eos must be true or false, got 'no'"),  # ignored EOS
    ({"length_penalty": "1"}, "length_penalty must be a number, got '1'"),
])
def test_beam_search_fields_of_the_wrong_type_are_refused_by_name(fields, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        BeamSearchParams(**{"beam_width": 2, **fields})


def test_ignore_eos_keeps_eos_as_a_plain_token():
    search = BeamSearch([5], BeamSearchParams(beam_width=1, max_tokens=2, ignore_eos=True), {EOS}, 64)
    search.advance([answer([(EOS, -0.1), (1, -0.5)])])
    assert search.beams() == [[5, EOS]] and not search.done


def test_logprobs_asked_for_do_not_widen_the_candidates():
    """Width 1 asking for 3 logprobs: the round asks the engine for 3, but only the top 2 are
    candidates. Both end (EOS and another end id), so nothing goes on: the third, though
    given, is not a beam."""
    params = BeamSearchParams(beam_width=1, max_tokens=3, logprobs=3)
    assert params.round_params().logprobs == 3
    search = BeamSearch([5], params, {EOS, 9}, 64)
    search.advance([answer([(EOS, -0.1), (9, -0.2), (4, -3.0)])])
    assert search.done and search.beams() == []
    (best,) = search.output("r", Letters(), None, Letters.text).outputs
    assert best.token_ids == [EOS] and len(best.logprobs[0].top) == 3  # all 3 reported


def test_a_token_reports_the_alternatives_asked_for_not_the_candidates():
    """Width 2 asks each round for 4 logprobs (its candidates); logprobs=1 reports one
    alternative a token (it reported all 4), and no logprobs none."""
    for asked, reported in ((1, [(1, -0.1)]), (None, [])):
        search = BeamSearch([5], BeamSearchParams(beam_width=2, max_tokens=1, logprobs=asked),
                            {EOS}, 64)
        search.advance([answer([(1, -0.1), (2, -0.2), (3, -0.3), (4, -0.4)])])
        best = search.output("r", Letters(), None, Letters.text).outputs[0]
        assert best.token_ids == [1] and best.logprobs[0].top == reported, asked

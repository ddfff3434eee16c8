"""Speculative decoding without weights: the n-gram proposer, acceptance, the scheduler's share
of drafts, and the config, each against hand-worked cases."""

from __future__ import annotations

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.engine.outputs import ModelRunnerOutput, TokenLogprobs
from inferlab.engine.request import RequestStatus
from inferlab.engine.spec_decode import (
    SpecDecodeCounters,
    SpeculativeConfig,
    accepted_tokens,
    propose_ngram,
)
from inferlab.errors import InferlabError
from tests.engine.factories import make_request, make_scheduler


def _ngram(low: int, high: int, k: int = 8) -> SpeculativeConfig:
    return SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=low, prompt_lookup_max=high)


def test_the_longest_suffix_that_occurred_before_wins():
    tokens = [1, 2, 3, 9, 9, 7, 2, 3, 5, 6, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0 (followed by 9, 9, 7...); [2, 3] occurred later, at 6
    assert propose_ngram(tokens, _ngram(1, 3), 3) == [9, 9, 7]
    # limited to unigrams, [3] occurred at 2 and 7: the earliest gives what followed it
    assert propose_ngram(tokens, _ngram(1, 1), 3) == [9, 9, 7]


@pytest.mark.parametrize(("tokens", "expected"), [
    ([7] * 8, [7, 7, 7, 7]),
    ([1, 2, 1, 2, 1, 2, 1, 2], [1, 2, 1, 2]),
    ([1, 2, 3, 9, 9, 1, 2, 3, 8, 8, 1, 2, 3], [9, 9, 1, 2]),
])
def test_the_earliest_occurrence_drafts_as_vllm_does(tokens, expected):
    """Once the latest: a periodic stretch got one period of drafts (a single [7] of 4)."""
    assert propose_ngram(tokens, _ngram(1, 3, k=4), 4) == expected


def test_drafts_stop_at_max_drafts_and_at_the_end_of_the_sequence():
    tokens = [4, 5, 6, 4, 5]
    assert propose_ngram(tokens, _ngram(2, 2), 1) == [6]
    assert propose_ngram(tokens, _ngram(2, 2), 8) == [6, 4, 5]  # runs into its own suffix
    assert propose_ngram(tokens, _ngram(2, 2), 0) == []


def test_no_occurrence_or_too_short_gives_no_drafts():
    assert propose_ngram([1, 2, 3, 4], _ngram(1, 3), 4) == []
    assert propose_ngram([7, 7], _ngram(2, 2), 4) == []  # a bigram needs a token after it
    assert propose_ngram([7, 7, 7], _ngram(2, 2), 4) == [7]


def test_a_match_across_token_boundaries_is_not_a_match():
    # little-endian int32 bytes: 16777221 = 05 00 00 01, 117899264 = 00 00 07 07, so bytes 2..5
    # of [16777221, 117899264] spell 256 (00 01 00 00) across the two tokens, before the real one
    a, b = 16777221, 117899264
    tokens = [a, b, 256, 9, 3, 256]
    assert propose_ngram(tokens, _ngram(1, 1), 3) == [9, 3, 256]


@pytest.mark.parametrize(("drafts", "sampled", "expected"), [
    ([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8]),  # all kept, and the token after them
    ([5, 6, 7], [5, 9, 7, 8], [5, 9]),  # the second differs: it replaces the draft
    ([5, 6, 7], [4, 6, 7, 8], [4]),  # the first differs
    ([], [3], [3]),  # no drafts: a plain step
])
def test_accepted_tokens(drafts, sampled, expected):
    assert accepted_tokens(drafts, sampled) == expected


def test_counters_record_acceptance_by_position():
    counters = SpecDecodeCounters()
    counters.record(3, 2)
    counters.record(4, 0)
    counters.record(2, 2)
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (3, 9, 4)
    assert counters.accepted_per_position == [2, 2, 0, 0]


def test_config_defaults_and_errors():
    assert (_ngram(None, None).prompt_lookup_min, _ngram(None, None).prompt_lookup_max) == (5, 5)
    assert _ngram(None, 3).prompt_lookup_min == 3 and _ngram(2, None).prompt_lookup_max == 2
    config = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4, '
                                         '"prompt_lookup_max": 3}')
    assert (config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (4, 3, 3)
    for bad, message in [('{"method": "eagle", "num_speculative_tokens": 2}', "only 'ngram'"),
                         ('{"num_speculative_tokens": 0}', "positive integer"),
                         ('{"method": "ngram"}', "needs num_speculative_tokens"),
                         ('{"num_speculative_tokens": 2, "model": "x"}', "unknown field"),
                         ('{"num_speculative_tokens": 2, "prompt_lookup_min": 4, '
                          '"prompt_lookup_max": 2}', "over prompt_lookup_max"),
                         ('{"num_speculative_tokens": 2, "disable_by_batch_size": 1}', "at least 2"),
                         # once read as unset: min 0 became 3, max 0 became 5
                         ('{"num_speculative_tokens": 4, "prompt_lookup_min": 0, '
                          '"prompt_lookup_max": 3}', "prompt_lookup_min must be a positive"),
                         ('{"num_speculative_tokens": 4, "prompt_lookup_max": 0}',
                          "prompt_lookup_m.. must be a positive integer, got 0"),
                         ("[2]", "JSON object"), ("{", "not JSON")]:
        with pytest.raises(InferlabError, match=message):
            SpeculativeConfig.from_json(bad)


def test_drafts_by_batch_size():
    """vLLM's num_speculative_tokens_per_batch_size ([first, last, k], any order) and
    disable_by_batch_size, each alone and together; outside every range, the maximum."""
    table = SpeculativeConfig.from_dict({"num_speculative_tokens": 4,
                                         "num_speculative_tokens_per_batch_size": [[3, 8, 0], [1, 2, 3]]})
    assert [table.drafts_for(b) for b in (1, 2, 3, 8, 9)] == [3, 3, 0, 0, 4]
    both = SpeculativeConfig(4, disable_by_batch_size=4, num_speculative_tokens_per_batch_size=[[1, 2, 2]])
    assert [both.drafts_for(b) for b in (1, 2, 3, 4, 5)] == [2, 2, 4, 4, 0]
    assert [SpeculativeConfig(4).drafts_for(b) for b in (1, 500)] == [4, 4]
    for bad, message in [([[1, 4, 2], [4, 8, 1]], "overlap"), ([[1, 2, 5]], "0 <= k"),
                         ([[2, 1, 0]], "first <= last"), ([[0, 1, 0]], "1 <= first"),
                         ([[1, 2]], r"not \[first, last, k\]"), ([[1, 2, True]], r"not \[first"),
                         ("1-2:3", "a list")]:
        with pytest.raises(InferlabError, match=message):
            SpeculativeConfig(4, num_speculative_tokens_per_batch_size=bad)


def test_the_command_line_reads_the_config_and_refuses_a_bad_one(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 3}'])
    assert engine_config_from_args(args).speculative_config == _ngram(5, 5, 3)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--speculative-config", '{"num_speculative_tokens": -1}'])
    assert exit_info.value.code == 2
    assert "positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["ngram", '{"method": "ngram"}', 5, [1]])
def test_a_speculative_config_that_is_no_dict_is_refused_by_name(value):
    """LLM(speculative_config="ngram") once built an engine that failed to start with an
    AttributeError ('str' object has no attribute 'num_speculative_tokens')."""
    with pytest.raises(InferlabError, match=f"speculative_config must be a dict .vLLM's., got "
                                            f"{type(value).__name__}"):
        EngineConfig(speculative_config=value)
    assert EngineConfig(speculative_config={"num_speculative_tokens": 3}).speculative_config == \
        _ngram(5, 5, 3)


def _decoding(scheduler, prompt, **kwargs):
    """A request admitted, its prompt computed and one token out: the next step is a decode."""
    request = make_request("r", prompt, **kwargs)
    scheduler.add_request(request)
    first = scheduler.schedule()
    scheduler.update_from_output(first, ModelRunnerOutput({"r": [50]}))
    return request


def test_a_decode_step_feeds_the_drafts_and_keeps_the_accepted_ones():
    s = make_scheduler(block_size=4, max_num_batched_tokens=64)
    request = _decoding(s, [1, 2, 3, 4, 5, 6], max_tokens=10)
    request.spec_token_ids = [60, 61, 62]
    step = s.schedule()
    (chunk,) = step.chunks
    assert (chunk.num_computed_tokens, chunk.num_new_tokens, chunk.spec_token_ids) == (6, 4, [60, 61, 62])
    assert chunk.samples and chunk.input_token_ids == [50, 60, 61, 62]
    assert len(request.block_ids) == 3  # slots for 10 tokens: 6 + the new one + 3 drafts
    # two drafts kept, the third replaced by 70
    s.update_from_output(step, ModelRunnerOutput({"r": [60, 61, 70]}))
    assert request.output_token_ids == [50, 60, 61, 70]
    assert request.num_computed_tokens == 9  # the prompt, 50, 60, 61: 70's K/V comes next step
    assert request.spec_token_ids == []


def test_the_budget_takes_as_many_drafts_as_it_has_room_for():
    s = make_scheduler(max_num_batched_tokens=3)
    request = _decoding(s, [1, 2], max_tokens=10)
    request.spec_token_ids = [60, 61, 62, 63]
    (chunk,) = s.schedule().chunks
    assert (chunk.num_new_tokens, chunk.spec_token_ids) == (3, [60, 61])


def test_a_stop_token_among_kept_drafts_ends_the_output_there():
    s = make_scheduler()
    request = _decoding(s, [1, 2, 3], max_tokens=10, stop_token_ids=[61])
    request.spec_token_ids = [60, 61, 62]
    step = s.schedule()
    logprobs = [TokenLogprobs(t, -0.5, 1, []) for t in (60, 61, 62, 63)]
    output = ModelRunnerOutput({"r": [60, 61, 62, 63]}, {"r": logprobs})
    s.update_from_output(step, output)
    assert request.output_token_ids == [50, 60, 61]
    assert request.status is RequestStatus.FINISHED_STOPPED and request.stop_reason == 61
    assert output.sampled_token_ids["r"] == [60, 61] and len(output.logprobs["r"]) == 2
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_max_tokens_reached_among_kept_drafts_ends_the_output_there():
    s = make_scheduler()
    request = _decoding(s, [1, 2, 3], max_tokens=3)
    request.spec_token_ids = [60, 61]
    step = s.schedule()
    s.update_from_output(step, ModelRunnerOutput({"r": [60, 61, 62]}))
    assert request.output_token_ids == [50, 60, 61]
    assert request.status is RequestStatus.FINISHED_LENGTH


def test_draft_positions_are_never_offered_to_the_prefix_cache():
    s = make_scheduler(block_size=4)
    request = _decoding(s, [1, 2, 3, 4, 5, 6], max_tokens=10)
    request.spec_token_ids = [60, 61]  # the step's K/V fills block 1 (positions 4..7) with drafts
    step = s.schedule()
    assert s.block_manager.num_cached_blocks == 1  # only the prompt's first block
    s.update_from_output(step, ModelRunnerOutput({"r": [70]}))  # both drafts rejected
    # the same six prompt tokens and 50, 60 (the rejected drafts) find one block only
    other = make_request("o", [1, 2, 3, 4, 5, 6, 50, 60, 61])
    assert s.block_manager.get_computed_blocks(other).num_tokens == 4


def test_preemption_drops_the_drafts():
    s = make_scheduler(num_blocks=3, block_size=4, max_num_batched_tokens=64)
    first = _decoding(s, [1, 2, 3, 4, 5, 6, 7], max_tokens=5)
    second = make_request("b", [9, 9, 9, 9, 9], max_tokens=4)
    s.add_request(second)
    step = s.schedule()  # "b" does not fit beside "r": only r decodes
    assert [c.request.request_id for c in step.chunks] == ["r"]
    s.update_from_output(step, ModelRunnerOutput({"r": [51]}))
    first.spec_token_ids = [60, 61, 62, 63]  # 13 slots: four blocks, one more than the pool
    step = s.schedule()
    assert first.status is RequestStatus.PREEMPTED and first.spec_token_ids == []
    assert step.chunks == [] or all(c.request is not first for c in step.chunks)


def test_every_draft_position_is_counted_from_the_start():
    """vLLM lists each position's series at 0 before any draft is kept; once only positions a
    step had verified were listed (never the last where the step budget cut the drafts)."""
    from inferlab.config import EngineConfig
    from inferlab.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory_bytes=8 * 2**20,
                                    speculative_config={"num_speculative_tokens": 4}))
    assert engine.spec_counters.accepted_per_position == [0, 0, 0, 0]

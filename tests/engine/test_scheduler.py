"""Scheduler: hand-computed steps on small pools (randomized runs: test_scheduler_random.py)."""

from __future__ import annotations

import pytest

from inferlab.engine.kv_cache_config import CacheConfig
from inferlab.engine.outputs import ModelRunnerOutput
from inferlab.engine.request import RequestStatus
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.errors import InferlabError

from .factories import chunk_sizes, make_request, make_scheduler, run_output


def step(scheduler, token_id: int = 7):
    """One engine step with a runner that samples `token_id`; returns (output, changed)."""
    output = scheduler.schedule()
    return output, scheduler.update_from_output(output, run_output(output, token_id))


def test_long_prompt_is_chunked_within_the_token_budget() -> None:
    s = make_scheduler(block_size=4, max_num_batched_tokens=10)
    r = make_request("r", 25, max_tokens=3)
    s.add_request(r)
    sizes = []
    for _ in range(5):
        output = s.schedule()
        sizes.append(chunk_sizes(output)["r"])
        assert output.total_num_scheduled_tokens == sizes[-1]
        assert [c.samples for c in output.chunks] == [len(sizes) >= 3]
        changed = s.update_from_output(output, run_output(output))
        assert changed == ([r] if len(sizes) >= 3 else [])
    assert sizes == [10, 10, 5, 1, 1]
    assert r.status is RequestStatus.FINISHED_LENGTH and r.output_token_ids == [7, 7, 7]
    assert s.block_manager.num_free_blocks == 64


def test_running_decodes_go_before_admission_and_share_the_budget() -> None:
    s = make_scheduler(max_num_batched_tokens=10)
    s.add_request(make_request("a", 6, max_tokens=5))
    assert chunk_sizes(step(s)[0]) == {"a": 6}
    s.add_request(make_request("b", 20, max_tokens=5))
    steps = [step(s)[0] for _ in range(3)]
    assert [chunk_sizes(o) for o in steps] == [{"a": 1, "b": 9}, {"a": 1, "b": 9},
                                               {"a": 1, "b": 2}]
    assert [c.request.request_id for c in steps[0].chunks] == ["a", "b"]
    assert [o.total_num_scheduled_tokens for o in steps] == [10, 10, 3]


def test_max_num_seqs_caps_the_batch() -> None:
    s = make_scheduler(max_num_seqs=2)
    for name in "abc":
        s.add_request(make_request(name, 3, max_tokens=2))
    assert chunk_sizes(step(s)[0]) == {"a": 3, "b": 3}
    assert chunk_sizes(step(s)[0]) == {"a": 1, "b": 1}  # both finish here
    assert chunk_sizes(step(s)[0]) == {"c": 3}


def test_long_prefill_token_threshold_caps_a_long_prompt_and_leaves_budget_to_a_short_one() -> None:
    """Budget 32: a 40-token prompt took the whole first step and the 10-token one behind it
    waited; capped at 16 a step, the long prompt takes 16, 16, then its last 8, and the short
    one runs from the first step (decodes, 1 token, are below any cap)."""
    plain, capped = make_scheduler(max_num_batched_tokens=32), make_scheduler(max_num_batched_tokens=32,
                                                                              long_prefill_token_threshold=16)
    for s in (plain, capped):
        s.add_request(make_request("long", 40, max_tokens=3))
        s.add_request(make_request("short", 10, max_tokens=3))
    assert [chunk_sizes(step(plain)[0]) for _ in range(2)] == [{"long": 32}, {"long": 8, "short": 10}]
    assert [chunk_sizes(step(capped)[0]) for _ in range(4)] == [
        {"long": 16, "short": 10}, {"long": 16, "short": 1}, {"long": 8, "short": 1}, {"long": 1}]


def test_a_prompt_no_longer_than_the_threshold_is_not_cut() -> None:
    s = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=12)
    s.add_request(make_request("a", 12, max_tokens=2))
    s.add_request(make_request("b", 13, max_tokens=2))
    assert chunk_sizes(step(s)[0]) == {"a": 12, "b": 12}
    assert chunk_sizes(step(s)[0]) == {"a": 1, "b": 1}


@pytest.mark.parametrize(("fields", "message"), [
    ({"long_prefill_token_threshold": -1}, "must be at least 0"),
    ({"long_prefill_token_threshold": 8, "enable_chunked_prefill": False, "max_num_batched_tokens": 256},
     "needs chunked prefill")])
def test_a_threshold_out_of_range_is_refused(fields, message) -> None:
    with pytest.raises(InferlabError, match=message):
        SchedulerConfig(**{"max_model_len": 256, **fields})


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room() -> None:
    s = make_scheduler(max_num_batched_tokens=16, max_model_len=16,
                       enable_chunked_prefill=False)
    s.add_request(make_request("a", 10, max_tokens=4))
    s.add_request(make_request("b", 10, max_tokens=4))
    assert chunk_sizes(step(s)[0]) == {"a": 10}  # 6 tokens left: not enough for b
    assert chunk_sizes(step(s)[0]) == {"a": 1, "b": 10}


def test_head_of_line_blocks_admission_strictly_fcfs() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    s.add_request(make_request("big", 20, max_tokens=3))  # 5 blocks
    s.add_request(make_request("next", 16, max_tokens=2))  # 4 blocks: only 3 left
    s.add_request(make_request("small", 4, max_tokens=1))  # would fit, but waits its turn
    assert chunk_sizes(step(s)[0]) == {"big": 20}
    assert chunk_sizes(step(s)[0]) == {"big": 1}  # 21 tokens: a 6th block, 2 free
    assert chunk_sizes(step(s)[0]) == {"big": 1}  # big finishes, frees 6 blocks
    assert chunk_sizes(step(s)[0]) == {"next": 16, "small": 4}


def test_admission_needs_the_whole_remaining_prompt_not_only_the_chunk() -> None:
    s = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=8)
    s.add_request(make_request("a", 12, max_tokens=4))  # 3 blocks for its prompt
    s.add_request(make_request("b", 16, max_tokens=4))  # 4 blocks; its first chunk needs 0
    assert chunk_sizes(step(s)[0]) == {"a": 8}
    assert chunk_sizes(step(s)[0]) == {"a": 4}  # b's 4-token chunk would fit, its prompt not
    assert s.num_waiting == 1


def test_preemption_frees_the_latest_request_and_resumes_it_from_the_prefix_cache() -> None:
    s = make_scheduler(num_blocks=4, block_size=4)
    a = make_request("a", 7, max_tokens=4)
    b = make_request("b", 7, max_tokens=4)
    s.add_request(a)
    s.add_request(b)
    assert chunk_sizes(step(s)[0]) == {"a": 7, "b": 7}  # 2 blocks each: pool full
    assert chunk_sizes(step(s)[0]) == {"a": 1, "b": 1}  # the 8th tokens fill those blocks
    b_blocks = list(b.block_ids)

    output, _ = step(s)  # a needs a 3rd block: b, admitted last, is preempted
    assert chunk_sizes(output) == {"a": 1} and output.preempted_request_ids == ["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.block_ids == [] and b.output_token_ids == [7, 7] and b.num_preemptions == 1
    assert a.block_ids[2] == b_blocks[1]  # b's blocks were freed tail first
    s.add_request(make_request("c", 2, max_tokens=1))  # fits, but b is ahead of it
    assert [r.request_id for r in s.waiting] == ["b", "c"]

    # b's first block is still cached, its second was reused; 3 blocks > 1 free: b waits
    assert chunk_sizes(step(s)[0]) == {"a": 1}  # a finishes (4 tokens)
    output, _ = step(s)
    assert chunk_sizes(output) == {"b": 5, "c": 2}
    assert output.chunks[0].num_computed_tokens == 4  # the cached first block
    assert output.finished_request_ids == ["a"]
    assert b.num_cached_tokens == 0  # recorded at first admission only
    step(s)
    assert b.status is RequestStatus.FINISHED_LENGTH and b.output_token_ids == [7] * 4
    stats = s.stats()
    assert stats.num_preemptions_total == 1
    # b's resumption (9 tokens, 4 hit) is not a query, as vLLM counts them
    assert stats.prefix_cache_queried_tokens == 7 + 7 + 2
    assert stats.prefix_cache_hit_tokens == 0
    assert stats.num_free_blocks == 4 and stats.kv_cache_usage == 0.0


def test_a_request_that_is_the_latest_preempts_itself() -> None:
    s = make_scheduler(num_blocks=4, block_size=4)
    a = make_request("a", 7, max_tokens=4)
    b = make_request("b", 8, max_tokens=4)
    s.add_request(a)
    s.add_request(b)
    assert chunk_sizes(step(s)[0]) == {"a": 7, "b": 8}
    output, _ = step(s)  # a's 8th token fits its blocks; b's 9th needs a block
    assert chunk_sizes(output) == {"a": 1} and output.preempted_request_ids == ["b"]
    assert b.status is RequestStatus.PREEMPTED and s.running == [a]


def test_a_preempted_request_goes_back_ahead_of_newer_ones() -> None:
    s = make_scheduler(num_blocks=5, block_size=4)
    a = make_request("a", 7, max_tokens=4)
    b = make_request("b", 7, max_tokens=4)
    s.add_request(a)
    s.add_request(b)
    step(s)
    step(s)
    s.add_request(make_request("tiny", 1, max_tokens=1))  # one block; one is free
    output, _ = step(s)  # a takes the free block; b needs one more: b is preempted
    assert chunk_sizes(output) == {"a": 1} and output.preempted_request_ids == ["b"]
    assert [r.request_id for r in s.waiting] == ["b", "tiny"]


def test_siblings_with_the_same_prompt_share_its_blocks_in_one_step() -> None:
    s = make_scheduler(num_blocks=64, block_size=4)
    prompt = list(range(9))
    kids = [make_request(f"p#{i}", prompt, max_tokens=2) for i in range(3)]
    for kid in kids:
        s.add_request(kid)
    output, _ = step(s)
    assert chunk_sizes(output) == {"p#0": 9, "p#1": 1, "p#2": 1}
    assert [c.num_computed_tokens for c in output.chunks] == [0, 8, 8]
    assert kids[0].block_ids[:2] == kids[1].block_ids[:2] == kids[2].block_ids[:2]
    assert s.block_manager.ref_count(kids[0].block_ids[0]) == 3
    assert s.block_manager.num_free_blocks == 64 - 5
    assert [k.num_cached_tokens for k in kids] == [0, 8, 8]


@pytest.mark.parametrize("prompt_len, cached", [(8, 4), (9, 8), (4, 0), (3, 0)])
def test_prefix_hits_skip_whole_blocks_but_never_the_last_token(prompt_len: int,
                                                                 cached: int) -> None:
    s = make_scheduler(block_size=4)
    prompt = list(range(prompt_len))
    s.add_request(make_request("first", prompt, max_tokens=1))
    step(s)
    again = make_request("again", prompt, max_tokens=1)
    s.add_request(again)
    output, _ = step(s)
    assert output.chunks[0].num_computed_tokens == cached
    assert chunk_sizes(output) == {"again": prompt_len - cached}
    assert again.num_cached_tokens == cached


def test_prefix_caching_off_never_hits() -> None:
    s = make_scheduler(block_size=4, enable_prefix_caching=False)
    s.add_request(make_request("first", list(range(9)), max_tokens=1))
    step(s)
    s.add_request(make_request("again", list(range(9)), max_tokens=1))
    assert chunk_sizes(step(s)[0]) == {"again": 9}


def test_abort_frees_every_block_and_reports_the_ids_next_step() -> None:
    s = make_scheduler(num_blocks=6, block_size=4)
    running = make_request("running", 12, max_tokens=8)
    waiting = make_request("waiting", 16, max_tokens=8)  # 4 blocks, 3 free: waits
    s.add_request(running)
    s.add_request(waiting)
    step(s)
    assert s.num_running == 1 and s.num_waiting == 1
    done = s.finish_requests(["running", "waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert sorted(r.request_id for r in done) == ["running", "waiting"]
    assert running.status is waiting.status is RequestStatus.FINISHED_ABORTED
    assert running.finished_time is not None and running.block_ids == []
    assert s.block_manager.num_free_blocks == 6 and not s.has_unfinished_requests()
    output = s.schedule()
    assert output.is_empty and sorted(output.finished_request_ids) == ["running", "waiting"]
    assert s.schedule().finished_request_ids == []
    assert s.finish_requests("running", RequestStatus.FINISHED_ABORTED) == []


def test_a_request_aborted_between_schedule_and_update_is_left_alone() -> None:
    s = make_scheduler()
    r = make_request("r", 5, max_tokens=4)
    s.add_request(r)
    output = s.schedule()
    s.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert s.update_from_output(output, run_output(output)) == []
    assert r.output_token_ids == [] and r.status is RequestStatus.FINISHED_ABORTED
    assert s.block_manager.num_free_blocks == 64


def finish_after(token_ids: list[int], **request_args):
    """Feed a request these sampled tokens one step at a time; return it when it stops."""
    s = make_scheduler()
    r = make_request("r", 3, **request_args)
    s.add_request(r)
    for token_id in token_ids:
        _, changed = step(s, token_id)
        assert changed == [r]
        if r.finished:
            return r
    return r


def test_stop_conditions() -> None:
    eos = finish_after([5, 2, 5], max_tokens=8, eos_token_id=2)
    assert eos.status is RequestStatus.FINISHED_STOPPED and eos.stop_reason is None
    assert eos.output_token_ids == [5, 2]

    ignored = finish_after([2, 2, 2], max_tokens=3, eos_token_id=2, ignore_eos=True)
    assert ignored.status is RequestStatus.FINISHED_LENGTH
    assert ignored.output_token_ids == [2, 2, 2]

    held = finish_after([2, 9, 2], max_tokens=8, eos_token_id=2, min_tokens=3,
                        stop_token_ids=[9])
    assert held.output_token_ids == [2, 9, 2] and held.stop_reason is None

    stop_id = finish_after([4, 9], max_tokens=8, stop_token_ids=[9])
    assert stop_id.status is RequestStatus.FINISHED_STOPPED and stop_id.stop_reason == 9

    last = finish_after([4, 9], max_tokens=2, stop_token_ids=[9])
    assert last.status is RequestStatus.FINISHED_STOPPED  # a stop token wins over length

    length = finish_after([4, 4, 4, 4], max_tokens=3)
    assert length.status is RequestStatus.FINISHED_LENGTH and length.output_token_ids == [4] * 3
    assert length.finished_time is not None and length.first_scheduled_time is not None


def test_requests_that_can_never_fit_are_rejected_with_the_numbers() -> None:
    s = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(InferlabError, match=r"prompt \(60 tokens\) \+ max_tokens \(5\) = 65 "
                                            r"exceeds max_model_len \(64\)"):
        s.add_request(make_request("long", 60, max_tokens=5))
    with pytest.raises(InferlabError, match="20 tokens need 5 KV blocks of 4 tokens but the "
                                            "cache has only 4"):
        s.add_request(make_request("big", 16, max_tokens=5))
    with pytest.raises(InferlabError, match="prompt is empty"):
        s.add_request(make_request("empty", [], max_tokens=1))
    s.add_request(make_request("ok", 12, max_tokens=5))  # 16 tokens of K/V: exactly 4 blocks
    with pytest.raises(InferlabError, match="already in use"):
        s.add_request(make_request("ok", 1, max_tokens=1))
    assert s.num_waiting == 1


def test_configs_reject_bad_values() -> None:
    with pytest.raises(InferlabError, match="max_num_seqs must be at least 1"):
        SchedulerConfig(max_model_len=16, max_num_seqs=0)
    with pytest.raises(InferlabError, match=r"max_num_batched_tokens \(8\) must be at least "
                                            r"max_model_len \(16\)"):
        SchedulerConfig(max_model_len=16, max_num_seqs=8, max_num_batched_tokens=8,
                        enable_chunked_prefill=False)
    # vLLM's SchedulerConfig refuses a step budget below the batch: decodes first, a token
    # each, would leave the requests past the budget waiting for others to finish
    with pytest.raises(InferlabError, match=r"max_num_batched_tokens \(2\) must be greater than or "
                                            r"equal to max_num_seqs \(4\)"):
        SchedulerConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=2)
    SchedulerConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=4)
    with pytest.raises(InferlabError, match="power of two"):
        CacheConfig(block_size=12, num_blocks=4)
    with pytest.raises(InferlabError, match="at least one block"):
        CacheConfig(num_blocks=0)


def test_update_without_a_sampled_token_for_a_sampling_chunk_is_a_bug() -> None:
    s = make_scheduler()
    s.add_request(make_request("r", 3))
    output = s.schedule()
    with pytest.raises(KeyError):
        s.update_from_output(output, ModelRunnerOutput({}))

"""Scheduler under the "priority" policy (vLLM's --scheduling-policy priority): hand-computed steps."""

from __future__ import annotations

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.request import RequestStatus
from inferlab.engine.request_queue import PriorityQueue, lowest_priority
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.errors import InferlabError

from .factories import chunk_sizes, make_request, make_scheduler, run_output


def step(scheduler):
    output = scheduler.schedule()
    scheduler.update_from_output(output, run_output(output))
    return output


def test_admission_goes_by_priority_then_arrival() -> None:
    s = make_scheduler(max_num_seqs=1, policy="priority")
    for name, priority in (("late-low", 2), ("first-high", 0), ("second-high", 0), ("mid", 1)):
        s.add_request(make_request(name, 3, max_tokens=1, priority=priority))
    assert [r.request_id for r in s.waiting] == ["first-high", "second-high", "mid", "late-low"]
    admitted = [next(iter(chunk_sizes(step(s)))) for _ in range(4)]  # one step each
    assert admitted == ["first-high", "second-high", "mid", "late-low"]


def test_fcfs_admits_by_arrival_whatever_the_priority() -> None:
    s = make_scheduler(max_num_seqs=1)
    for name, priority in (("a", 2), ("b", 0)):
        s.add_request(make_request(name, 3, max_tokens=1, priority=priority))
    assert [next(iter(chunk_sizes(step(s)))) for _ in range(2)] == ["a", "b"]


@pytest.mark.parametrize("policy, scheduled, victim", [
    ("fcfs", {"low": 1}, "high"),  # the latest admitted goes, itself here
    ("priority", {"high": 1}, "low"),  # the lowest priority goes, though admitted first
])
def test_the_victim_of_a_preemption_follows_the_policy(policy, scheduled, victim) -> None:
    s = make_scheduler(num_blocks=4, block_size=4, policy=policy)
    low = make_request("low", 6, max_tokens=8, priority=5 if policy == "priority" else 0)
    high = make_request("high", 8, max_tokens=8)
    s.add_request(low)
    assert chunk_sizes(step(s)) == {"low": 6}  # 2 blocks
    s.add_request(high)
    assert chunk_sizes(step(s)) == {"low": 1, "high": 8}  # 2 blocks more: the pool is full
    # low's 8th token fits its second block and is scheduled first; high's 9th needs a block
    output = step(s)
    assert chunk_sizes(output) == scheduled and output.preempted_request_ids == [victim]
    gone = low if victim == "low" else high
    assert gone.status is RequestStatus.PREEMPTED and gone.block_ids == []
    assert s.running == [high if victim == "low" else low]
    # outputs kept: low sampled at its first two steps, high at its first; none added this step
    assert gone.output_token_ids == [7] * (2 if victim == "low" else 1)


def test_a_chunk_taken_back_returns_its_tokens_to_the_step_budget() -> None:
    # blocks of 2 tokens, 8 of them, 3 tokens a step; a (priority 3) arrives at step 0, c
    # (priority 2) at step 1, b (priority 0) at step 3; prompts of 4 tokens
    s = make_scheduler(num_blocks=8, block_size=2, max_num_batched_tokens=3, policy="priority")
    a = make_request("a", 4, max_tokens=6, priority=3)
    b = make_request("b", 4, max_tokens=4, priority=0)
    c = make_request("c", 4, max_tokens=5, priority=2)
    s.add_request(a)
    assert chunk_sizes(step(s)) == {"a": 3}  # 2 blocks
    s.add_request(c)
    assert chunk_sizes(step(s)) == {"a": 1, "c": 2}  # a samples; c: 1 block
    assert chunk_sizes(step(s)) == {"a": 1, "c": 2}  # a: block 3; c: block 2, samples
    s.add_request(b)
    assert chunk_sizes(step(s)) == {"a": 1, "c": 1, "b": 1}  # c: block 3; b: 1 block
    assert chunk_sizes(step(s)) == {"a": 1, "c": 1, "b": 1}  # a: block 4; none free now
    # a's position 7 fits its 4th block (budget 3 -> 2); c's position 6 needs a block: a is
    # preempted, its token given back (-> 3); c takes 1 (-> 2), and b's last 2 prompt tokens fit
    output = step(s)
    assert chunk_sizes(output) == {"c": 1, "b": 2} and output.preempted_request_ids == ["a"]
    assert output.total_num_scheduled_tokens == 3
    assert [r.request_id for r in s.running] == ["c", "b"] and list(s.waiting) == [a]


def test_a_chunk_taken_back_leaves_no_block_in_the_prefix_cache() -> None:
    """Its allocation had offered the block its tokens would fill to the hash table; taken
    back uncomputed, the block stayed findable, and a later prompt with those tokens read K/V
    that was never written."""
    s = make_scheduler(num_blocks=5, block_size=4, policy="priority")
    low = make_request("low", 6, max_tokens=8, priority=5)
    s.add_request(low)
    step(s)  # positions 0-5: 2 blocks
    s.add_request(make_request("high", 8, max_tokens=8))
    assert chunk_sizes(step(s)) == {"low": 1, "high": 8}  # 2 blocks more: 1 left
    # low's position 7 fills its 2nd block, its 2 drafts take the last one; high's position 8
    # needs a block: low goes, its chunk with it
    low.spec_token_ids = [60, 61]
    output = step(s)
    assert chunk_sizes(output) == {"high": 1} and output.preempted_request_ids == ["low"]
    probe = make_request("probe", [*low.prompt_token_ids, 7, 7, 1, 2])  # low's 8 tokens, then others
    assert s.block_manager.get_computed_blocks(probe).num_tokens == 4  # the 1st block only


def test_a_preempted_request_waits_behind_higher_priorities_not_in_front() -> None:
    s = make_scheduler(num_blocks=4, block_size=4, policy="priority")
    s.add_request(make_request("high", 7, max_tokens=4, priority=0))
    s.add_request(make_request("low", 7, max_tokens=4, priority=1))
    step(s)
    step(s)  # both hold 2 full blocks
    s.add_request(make_request("new-high", 1, max_tokens=1, priority=0))
    s.add_request(make_request("new-low", 1, max_tokens=1, priority=2))
    output = step(s)  # high needs a 3rd block: low goes
    assert output.preempted_request_ids == ["low"]
    assert [r.request_id for r in s.waiting] == ["new-high", "low", "new-low"]


def test_the_victim_is_the_latest_among_equal_priorities() -> None:
    requests = [make_request(name, 1, priority=p) for name, p in (("a", 1), ("b", 0), ("c", 1))]
    requests[2].arrival_time = requests[0].arrival_time  # n > 1 copies share an arrival time
    assert lowest_priority(requests) == 2
    assert lowest_priority(requests[:2]) == 0


def test_the_priority_queue_removes_and_keeps_its_order() -> None:
    queue = PriorityQueue()
    for name, p in (("x", 3), ("y", 1), ("z", 2), ("w", 1)):
        queue.add(make_request(name, 1, priority=p))
    queue.remove({"y", "nobody"})
    assert [r.request_id for r in queue] == ["w", "z", "x"] and len(queue) == 3
    assert queue.pop().request_id == "w" and queue.peek().request_id == "z"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InferlabError, match="scheduling policy must be one of fcfs, priority"):
        SchedulerConfig(max_model_len=16, policy="lifo")
    with pytest.raises(InferlabError, match="scheduling_policy must be one of fcfs, priority"):
        EngineConfig(scheduling_policy="sjf")

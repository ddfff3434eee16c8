"""Scheduler: randomized workloads (hypothesis) run against a shadow KV cache: every step keeps
the budget and the rules, every finished request's slots held the tokens attention would read,
and no block leaks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.engine.outputs import ModelRunnerOutput
from inferlab.engine.request import RequestStatus
from inferlab.errors import InferlabError

from .factories import make_request, make_scheduler

PROMPT_HEADS = [[], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [8] * 9]

workload_requests = st.lists(
    st.tuples(st.sampled_from(PROMPT_HEADS), st.lists(st.integers(0, 2), max_size=6),
              st.integers(1, 6),  # max_tokens
              st.integers(1, 3),  # n: siblings with the same prompt
              st.integers(0, 6),  # arrival step
              st.one_of(st.none(), st.integers(0, 12)),  # abort step
              st.integers(0, 2)),  # priority (under the priority policy)
    min_size=1, max_size=6)


def fake_token(request) -> int:
    """A deterministic 'model': siblings and resumed requests sample the same tokens."""
    return sum(request.all_token_ids) % 3


class ShadowKV:
    """Which token each KV slot holds: what attention would read back."""

    def __init__(self, scheduler) -> None:
        self.s = scheduler
        self.slots: dict[tuple[int, int], int] = {}

    def write_then_read(self, output) -> None:
        """A write that clobbers another request's K/V fails that request's next read.

        Writing a block another request holds is legal only in one case: a sibling admitted
        in the same step hit the block before it was computed (same tokens, same K/V).
        """
        size = self.s.cache_config.block_size
        for c in output.chunks:  # every layer writes all new K/V first ...
            for pos in range(c.num_computed_tokens, c.num_computed_tokens + c.num_new_tokens):
                block = c.request.block_ids[pos // size]
                self.slots[(block, pos % size)] = c.request.all_token_ids[pos]
        for c in output.chunks:  # ... then attention reads each sequence's whole context
            for pos in range(c.num_computed_tokens + c.num_new_tokens):
                block = c.request.block_ids[pos // size]
                assert self.slots.get((block, pos % size)) == c.request.all_token_ids[pos]


def check_step(s, output, running_before: set[str], waiting_before: list[str]) -> None:
    config = s.config
    ids = [c.request.request_id for c in output.chunks]
    assert len(ids) == len(set(ids)) <= config.max_num_seqs
    assert output.total_num_scheduled_tokens == sum(c.num_new_tokens for c in output.chunks)
    assert output.total_num_scheduled_tokens <= config.max_num_batched_tokens
    admitted = [i for i in ids if i not in running_before]
    assert admitted == waiting_before[:len(admitted)], "admission strictly in queue order"
    if output.preempted_request_ids:
        assert not admitted
        assert not set(output.preempted_request_ids) & set(ids), "a preempted request computes nothing"
    for c in output.chunks:
        assert c.num_new_tokens >= 1
        assert c.num_computed_tokens + c.num_new_tokens <= c.request.num_tokens
        if not config.enable_chunked_prefill and c.request.request_id in admitted:
            assert c.samples, "without chunked prefill a prompt is computed in one step"


def check_blocks(s) -> None:
    bm = s.block_manager
    held = [b for r in s.running for b in r.block_ids]
    for block in range(bm.num_blocks):
        assert bm.ref_count(block) == held.count(block)
    assert bm.num_free_blocks == bm.num_blocks - len(set(held))
    assert all(not r.block_ids for r in s.waiting)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([2, 4]), num_blocks=st.integers(4, 20),
       budget=st.integers(1, 24), max_num_seqs=st.integers(1, 5), chunked=st.booleans(),
       caching=st.booleans(), policy=st.sampled_from(["fcfs", "priority"]),
       workload=workload_requests)
def test_random_workloads_finish_with_correct_kv_and_no_leaked_block(
        block_size, num_blocks, budget, max_num_seqs, chunked, caching, policy, workload) -> None:
    max_model_len = 24
    if not chunked:
        budget = max(budget, max_model_len)
    s = make_scheduler(num_blocks=num_blocks, block_size=block_size,
                       max_num_seqs=min(max_num_seqs, budget),
                       max_num_batched_tokens=budget, max_model_len=max_model_len,
                       enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                       policy=policy)
    kv = ShadowKV(s)
    accepted, aborted = [], set()
    for step_index in range(400):
        for k, (head, tail, max_tokens, n, arrival, _, priority) in enumerate(workload):
            if arrival != step_index:
                continue
            for i in range(n):
                request = make_request(f"{k}#{i}", head + tail or [0], max_tokens=max_tokens,
                                       priority=priority)
                try:
                    s.add_request(request)
                except InferlabError:
                    needed = -(-(request.num_prompt_tokens + max_tokens - 1) // block_size)
                    assert (request.num_prompt_tokens + max_tokens > max_model_len
                            or needed > num_blocks)
                    continue
                accepted.append(request)
        for k, (*_, abort_at, _) in enumerate(workload):
            if abort_at == step_index:
                ids = [r.request_id for r in accepted if r.request_id.startswith(f"{k}#")]
                aborted.update(r.request_id for r in s.finish_requests(
                    ids, RequestStatus.FINISHED_ABORTED))
        running_before = {r.request_id for r in s.running}
        waiting_before = [r.request_id for r in s.waiting]
        output = s.schedule()
        check_step(s, output, running_before, waiting_before)
        kv.write_then_read(output)
        sampled = {c.request.request_id: [fake_token(c.request)] for c in output.chunks if c.samples}
        s.update_from_output(output, ModelRunnerOutput(sampled))
        check_blocks(s)
        if not s.has_unfinished_requests() and step_index > 6:
            break
    assert not s.has_unfinished_requests(), "every request finishes (no livelock)"
    assert s.block_manager.num_free_blocks == num_blocks
    for request in accepted:
        if request.request_id in aborted:
            assert request.status is RequestStatus.FINISHED_ABORTED
            continue
        assert request.status is RequestStatus.FINISHED_LENGTH
        assert request.num_output_tokens == request.max_tokens

"""Block manager: hand-built cases and a stateful property test against a shadow KV cache."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inferlab.engine.block_manager import BlockManager, CachedPrefix

from .factories import make_request


def admit(bm: BlockManager, request, num_new: int | None = None) -> CachedPrefix:
    """Look up, allocate the whole remaining prompt (or num_new tokens), mark it computed."""
    prefix = bm.get_computed_blocks(request)
    num_new = request.num_tokens - prefix.num_tokens if num_new is None else num_new
    assert bm.allocate_slots(request, num_new, prefix)
    request.num_computed_tokens = prefix.num_tokens + num_new
    return prefix


def test_a_cache_salt_shares_prefix_blocks_only_with_the_same_salt() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(13))  # three full blocks, the last token always recomputed
    admit(bm, make_request("a", prompt, cache_salt="tenant-a"))
    assert bm.get_computed_blocks(make_request("b", prompt, cache_salt="tenant-b")).num_tokens == 0
    assert bm.get_computed_blocks(make_request("plain", prompt)).num_tokens == 0
    assert bm.get_computed_blocks(make_request("a2", prompt, cache_salt="tenant-a")).num_tokens == 12
    admit(bm, make_request("p", prompt))
    assert bm.get_computed_blocks(make_request("p2", prompt)).num_tokens == 12


def test_any_string_keys_a_chain_lone_surrogates_included() -> None:
    """JSON's "\\ud800" is a legal string: a salt or a group id holding one once raised
    UnicodeEncodeError on the engine thread at the next schedule, which stopped the engine."""
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(9))
    admit(bm, make_request("a", prompt, cache_salt="\ud800"))
    assert bm.get_computed_blocks(make_request("b", prompt, cache_salt="\ud800")).num_tokens == 8
    assert bm.get_computed_blocks(make_request("c", prompt, cache_salt="\udc00")).num_tokens == 0
    off = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    copies = [make_request(f"n{i}", prompt) for i in range(2)]
    for copy in copies:
        copy.prompt_group = "\udfff"
    assert admit(off, copies[0]).num_tokens == 0 and admit(off, copies[1]).num_tokens == 8


def test_eviction_follows_lru_order_and_chain_tails_go_first() -> None:
    bm = BlockManager(num_blocks=7, block_size=4)
    a = make_request("a", list(range(12)))
    admit(bm, a)
    assert a.block_ids == [0, 1, 2]
    assert bm.num_cached_blocks == 3  # all three blocks are full
    bm.free(a)
    # untouched blocks first, then a's chain released from its tail
    assert bm.free_block_ids() == [3, 4, 5, 6, 2, 1, 0]
    b, c = make_request("b", 8), make_request("c", 12)
    admit(bm, b)
    admit(bm, c)
    assert b.block_ids == [3, 4] and c.block_ids == [2, 5, 6]  # a's last block evicted
    assert bm.free_block_ids() == [1, 0]

    d = make_request("d", list(range(12)) + [50, 51, 52, 53])
    prefix = bm.get_computed_blocks(d)
    assert prefix == CachedPrefix((0, 1), 8)  # stops at the evicted third block
    # 4 blocks needed: 2 hits (both free, so they leave the pool) + 2 new; only 2 free
    assert not bm.can_allocate(d, 8, prefix)
    assert not bm.allocate_slots(d, 8, prefix)
    assert d.block_ids == [] and bm.free_block_ids() == [1, 0]
    assert bm.ref_count(0) == bm.ref_count(1) == 0

    bm.free(b)
    assert bm.free_block_ids() == [1, 0, 4, 3]
    assert bm.allocate_slots(d, 8, prefix)
    assert d.block_ids == [0, 1, 3, 4]  # hits revived, then the head of the queue, ascending
    assert bm.free_block_ids() == []
    # b's cached blocks were evicted before reuse: its prompt no longer hits
    assert bm.get_computed_blocks(make_request("b2", b.prompt_token_ids)).num_tokens == 0


def test_a_run_freed_tail_first_is_handed_out_front_to_back_again() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_request("a", 16)
    admit(bm, a)
    bm.free(a)
    assert bm.free_block_ids() == [3, 2, 1, 0]  # tail first, for eviction
    b = make_request("b", 16)
    admit(bm, b)
    assert b.block_ids == [0, 1, 2, 3]  # contiguous in the cache, in position order


def test_shared_prefix_is_ref_counted_and_the_last_token_is_never_a_hit() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    prompt = list(range(8))
    first = make_request("first", prompt)
    admit(bm, first)
    second = make_request("second", prompt)  # 8 tokens: only the first block may hit
    assert admit(bm, second) == CachedPrefix((first.block_ids[0],), 4)
    assert second.block_ids[0] == first.block_ids[0]
    assert second.block_ids[1] != first.block_ids[1]  # recomputed: the last token is in it
    assert bm.ref_count(first.block_ids[0]) == 2
    longer = make_request("longer", prompt + [99])
    assert admit(bm, longer).block_ids == tuple(first.block_ids)
    assert bm.ref_count(first.block_ids[1]) == 2

    bm.free(first)
    assert bm.ref_count(second.block_ids[0]) == 2  # still held by second and longer
    assert bm.num_free_blocks == 10 - 4
    bm.free(second)
    bm.free(longer)
    assert bm.num_free_blocks == 10 and bm.usage == 0.0
    assert bm.prefix_cache_queried_tokens == 8 + 8 + 9
    assert bm.prefix_cache_hit_tokens == 0 + 4 + 8


def test_blocks_are_cached_when_allocated_so_same_step_siblings_share_them() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    prompt = list(range(9))
    first = make_request("s0", prompt)
    assert bm.allocate_slots(first, 9, bm.get_computed_blocks(first))  # not computed yet
    sibling = make_request("s1", prompt)
    assert bm.get_computed_blocks(sibling).block_ids == tuple(first.block_ids[:2])


def test_partial_chunk_registers_only_the_blocks_it_fills() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    prompt = list(range(13))
    a = make_request("a", prompt)
    admit(bm, a, num_new=6)  # fills block 0 only
    assert bm.get_computed_blocks(make_request("x", prompt)).num_tokens == 4
    assert bm.allocate_slots(a, 5)  # tokens 6..10: fills block 1
    assert bm.get_computed_blocks(make_request("y", prompt)).num_tokens == 8
    assert len(a.block_ids) == 3


def test_same_tokens_computed_twice_keep_the_first_cached_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = make_request("a", list(range(4))), make_request("b", list(range(4)))
    admit(bm, a)
    admit(bm, b)  # 4 tokens: the last is recomputed, so no hit, a second copy
    first_copy = a.block_ids[0]
    assert b.block_ids != [first_copy]
    bm.free(a)
    bm.free(b)
    probe = make_request("p", list(range(5)))
    assert bm.get_computed_blocks(probe).block_ids == (first_copy,)


def test_reset_prefix_cache_and_disabled_cache_give_no_hits() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = make_request("a", list(range(9)))
    admit(bm, a)
    bm.reset_prefix_cache()
    assert bm.get_computed_blocks(make_request("b", list(range(9)))).num_tokens == 0
    assert bm.ref_count(a.block_ids[0]) == 1  # still allocated to a

    off = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    admit(off, make_request("c", list(range(9))))
    d = make_request("d", list(range(9)))
    assert admit(off, d).num_tokens == 0
    assert off.num_cached_blocks == 0 and off.prefix_cache_queried_tokens == 0


def test_cache_stats_count_only_first_admissions_that_read_the_cache() -> None:
    """As vLLM counts them; once n > 1 copies with caching off counted (and hit), and so did
    prompt-logprobs requests (which never read the cache) and preempted requests resuming."""
    off = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    copies = [make_request(f"n{i}", list(range(9))) for i in range(2)]
    for copy in copies:
        copy.prompt_group = "n"
    assert admit(off, copies[0]).num_tokens == 0 and admit(off, copies[1]).num_tokens == 8
    assert (off.prefix_cache_queried_tokens, off.prefix_cache_hit_tokens) == (0, 0)

    bm = BlockManager(num_blocks=8, block_size=4)
    admit(bm, make_request("a", list(range(9))))
    admit(bm, make_request("logprobs", list(range(9)), prompt_logprobs=0))
    resumed = make_request("resumed", list(range(9)))
    resumed.num_preemptions = 1
    assert admit(bm, resumed).num_tokens == 8
    assert (bm.prefix_cache_queried_tokens, bm.prefix_cache_hit_tokens) == (9, 0)


def test_allocation_failure_changes_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    a = make_request("a", 8)
    admit(bm, a)
    assert not bm.allocate_slots(a, 5)  # 13 tokens need 4 blocks, pool has 3
    assert a.block_ids == [0, 1] and bm.free_block_ids() == [2]
    assert bm.allocate_slots(a, 4)
    assert a.block_ids == [0, 1, 2]


def test_block_hash_does_not_depend_on_the_process_hash_seed() -> None:
    code = ("from inferlab.engine.block_manager import hash_block;"
            "print(hash_block(hash_block(b'', [1, 2, 3]), [4, 5]).hex())")
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True)
        digests.add(done.stdout.strip())
    assert len(digests) == 1


PREFIXES = [[], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [5] * 10]


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions, chunks, decodes and frees against a reference model.

    The reference: a shadow KV cache (which token each slot holds, written as the runner
    would), ref counts recounted from the live block tables, and the free queue as a plain
    list (freed blocks appended last block first, allocation from the head).
    """

    BLOCK_SIZE = 4

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=self.BLOCK_SIZE)
        self.live: dict[str, object] = {}
        self.kv: dict[int, dict[int, int]] = {}  # block -> offset -> token id
        self.queue = list(range(12))  # the reference free queue
        self.next_id = 0

    def _allocate(self, request, num_new: int, prefix: CachedPrefix | None) -> bool:
        old = list(request.block_ids)
        expected_ok = self.bm.can_allocate(request, num_new, prefix)
        ok = self.bm.allocate_slots(request, num_new, prefix)
        assert ok == expected_ok
        if not ok:
            assert request.block_ids == old
            return False
        hits = list(prefix.block_ids) if prefix else []
        new = request.block_ids[len(old) + len(hits):]
        assert request.block_ids[:len(old) + len(hits)] == old + hits
        self.queue = [b for b in self.queue if b not in hits]
        assert new == sorted(self.queue[:len(new)]), "new blocks: the queue's head, ascending"
        del self.queue[:len(new)]
        for block in new:
            self.kv[block] = {}
        return True

    def _compute(self, request, num_new: int) -> None:
        """Check what attention would read, then write this chunk's K/V."""
        size = self.BLOCK_SIZE
        tokens = request.all_token_ids
        start = request.num_computed_tokens
        for pos in range(start):
            assert self.kv[request.block_ids[pos // size]].get(pos % size) == tokens[pos]
        for pos in range(start, start + num_new):
            block = request.block_ids[pos // size]
            assert self.bm.ref_count(block) == 1, "never write into a shared block"
            self.kv[block][pos % size] = tokens[pos]
        request.num_computed_tokens += num_new

    @rule(head=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=9),
          chunk=st.integers(1, 16))
    def admit(self, head: list[int], tail: list[int], chunk: int) -> None:
        tokens = head + tail or [0]
        request = make_request(f"r{self.next_id}", tokens)
        self.next_id += 1
        prefix = self.bm.get_computed_blocks(request)
        assert prefix.num_tokens == len(prefix.block_ids) * self.BLOCK_SIZE
        assert prefix.num_tokens <= request.num_tokens - 1
        num_new = min(chunk, request.num_tokens - prefix.num_tokens)
        if self._allocate(request, num_new, prefix):
            request.num_computed_tokens = prefix.num_tokens
            self._compute(request, num_new)
            self.live[request.request_id] = request
        else:
            self.bm.free(request)  # drops its memoized hashes; it holds no block

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 8), sampled=st.integers(0, 3))
    def step(self, data, chunk: int, sampled: int) -> None:
        request = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token(sampled, 0.0)
        num_new = min(chunk, request.num_tokens - request.num_computed_tokens)
        if self._allocate(request, num_new, None):
            self._compute(request, num_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data) -> None:
        request = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        held = Counter(b for r in self.live.values() for b in r.block_ids)
        self.queue += [b for b in reversed(request.block_ids) if held[b] == 0]
        self.bm.free(request)
        assert request.block_ids == []

    @rule()
    def reset_prefix_cache(self) -> None:
        self.bm.reset_prefix_cache()
        assert self.bm.num_cached_blocks == 0

    @invariant()
    def ref_counts_match_live_block_tables(self) -> None:
        held = Counter(b for r in self.live.values() for b in r.block_ids)
        assert [self.bm.ref_count(b) for b in range(12)] == [held[b] for b in range(12)]
        for request in self.live.values():
            assert len(set(request.block_ids)) == len(request.block_ids)
            assert len(request.block_ids) == -(-request.num_computed_tokens // self.BLOCK_SIZE)

    @invariant()
    def free_queue_holds_exactly_the_unused_blocks_in_lru_order(self) -> None:
        assert self.bm.free_block_ids() == self.queue
        held = {b for r in self.live.values() for b in r.block_ids}
        assert set(self.queue) == set(range(12)) - held
        assert self.bm.num_free_blocks == 12 - len(held)


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_block_manager_state_machine = BlockManagerMachine.TestCase


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_rejects_an_empty_pool(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks, block_size)

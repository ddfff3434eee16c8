"""Continuous batching: which requests compute how many tokens this step.

The rule: each step, within max_num_batched_tokens tokens and max_num_seqs requests, every
request is given tokens toward its num_tokens. Running requests go first, in admission
order (a decode costs 1 token and its drafts if any, as many drafts as the budget leaves
room for; an unfinished prompt takes a chunk of what budget is left, at most
long_prefill_token_threshold tokens when that is set);
a running request that cannot get KV blocks preempts a running request, which is freed and
queued again: under "fcfs" the most recently admitted (itself if it is that one), under
"priority" the lowest priority (its chunk taken back if it had one this step). Preempting
itself ends the step's running part. Then, only if nobody was preempted this step, waiting
requests are admitted strictly in queue order (request_queue.py): the head of the queue is
admitted only if the blocks of its whole remaining prompt fit now (after prefix-cache hits),
otherwise admission stops.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from inferlab.engine.block_manager import BlockManager, cdiv
from inferlab.engine.kv_cache_config import CacheConfig
from inferlab.engine.outputs import ModelRunnerOutput, ScheduledChunk, SchedulerOutput
from inferlab.engine.request import Request, RequestStatus
from inferlab.engine.request_queue import lowest_priority, waiting_queue
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.errors import InferlabError


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot for /metrics and logs."""

    num_running: int  # requests holding KV blocks
    num_waiting: int  # requests queued, preempted ones included
    kv_cache_usage: float  # fraction of KV blocks held by running requests, in [0, 1]
    num_blocks: int  # KV blocks in the cache
    block_size: int  # tokens per KV block
    enable_prefix_caching: bool
    num_free_blocks: int  # free KV blocks (cached ones included: they can be evicted)
    prefix_cache_queried_tokens: int  # tokens of admitted requests looked up, since start
    prefix_cache_hit_tokens: int  # of which served from the prefix cache, since start
    num_preemptions_total: int  # preemptions since start


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockManager(cache_config.num_blocks, cache_config.block_size,
                                          cache_config.enable_prefix_caching)
        self.waiting = waiting_queue(scheduler_config.policy)
        self.running: list[Request] = []  # in admission order: fcfs preempts the last first
        self._requests: dict[str, Request] = {}  # unfinished requests by id
        self._finished_ids: list[str] = []  # finished since the last schedule()
        self.num_preemptions_total = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def add_request(self, request: Request) -> None:
        """Queue a request, or raise InferlabError if it could never be served."""
        self._check_fits(request)
        if request.request_id in self._requests:
            raise InferlabError(f"request id {request.request_id!r} is already in use")
        request.status = RequestStatus.WAITING
        request.queued_time = time.monotonic()
        self._requests[request.request_id] = request
        self.waiting.add(request)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        budget = self._schedule_running(budget, chunks, preempted)
        if not preempted:
            self._schedule_waiting(budget, chunks)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(
            chunks=chunks,
            total_num_scheduled_tokens=sum(c.num_new_tokens for c in chunks),
            preempted_request_ids=preempted,
            finished_request_ids=finished,
        )

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[Request]:
        """Record a computed step; return the requests that got a token or finished."""
        now = time.monotonic()
        changed: list[Request] = []
        stopped: set[str] = set()
        for chunk in scheduler_output.chunks:
            request = chunk.request
            if request.status is not RequestStatus.RUNNING:  # aborted since schedule()
                continue
            samples = chunk.samples
            request.num_computed_tokens += chunk.num_new_tokens - len(chunk.spec_token_ids)
            request.spec_token_ids = []
            if not samples:
                continue
            tokens = runner_output.sampled_token_ids[request.request_id]
            request.num_computed_tokens += len(tokens) - 1  # the drafts kept: their K/V are cached
            if self._append_until_stop(request, tokens, runner_output, now):
                stopped.add(request.request_id)
            changed.append(request)
        if stopped:
            self.running = [r for r in self.running if r.request_id not in stopped]
        return changed

    def _append_until_stop(self, request: Request, tokens: list[int],
                           runner_output: ModelRunnerOutput, now: float) -> bool:
        """Append a step's tokens up to the first that ends the request (the rest are cut from
        the runner's output, logprobs included); True if one did."""
        for i, token in enumerate(tokens):
            request.append_output_token(token, now)
            stop = self._stop_status(request)
            if stop is not None:
                request.stop_reason = stop[1]
                self._finish(request, stop[0], now)
                del tokens[i + 1:]
                logprobs = runner_output.logprobs.get(request.request_id)
                if logprobs is not None:
                    del logprobs[i + 1:]
                return True
        return False

    def finish_requests(self, request_ids: str | Iterable[str],
                        status: RequestStatus) -> list[Request]:
        """Finish (stop string) or abort requests by id; unknown or finished ids are ignored."""
        if not status.finished:
            raise ValueError(f"finish_requests needs a finished status, got {status}")
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        requests = [self._requests[i] for i in ids if i in self._requests]
        now = time.monotonic()
        for request in requests:
            self._finish(request, status, now)
        if requests:
            self.running = [r for r in self.running if r.request_id not in ids]
            self.waiting.remove(ids)
        return requests

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=bm.usage,
            num_blocks=bm.num_blocks,
            block_size=self.cache_config.block_size,
            enable_prefix_caching=self.cache_config.enable_prefix_caching,
            num_free_blocks=bm.num_free_blocks,
            prefix_cache_queried_tokens=bm.prefix_cache_queried_tokens,
            prefix_cache_hit_tokens=bm.prefix_cache_hit_tokens,
            num_preemptions_total=self.num_preemptions_total,
        )

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()

    def _check_fits(self, request: Request) -> None:
        rid = request.request_id
        if request.num_prompt_tokens == 0:
            raise InferlabError(f"request {rid}: the prompt is empty")
        total = request.num_prompt_tokens + request.max_tokens
        if total > self.config.max_model_len:
            raise InferlabError(
                f"request {rid}: prompt ({request.num_prompt_tokens} tokens) + max_tokens "
                f"({request.max_tokens}) = {total} exceeds max_model_len "
                f"({self.config.max_model_len})")
        # The last sampled token is never fed back, so its K/V needs no slot.
        block_size = self.cache_config.block_size
        num_blocks = cdiv(total - 1, block_size)
        if num_blocks > self.block_manager.num_blocks:
            raise InferlabError(
                f"request {rid}: {total - 1} tokens need {num_blocks} KV blocks of "
                f"{block_size} tokens but the cache has only {self.block_manager.num_blocks}")

    def _schedule_running(self, budget: int, chunks: list[ScheduledChunk],
                          preempted: list[str]) -> int:
        """Give running requests their next tokens; returns the budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            remaining = request.num_tokens - request.num_computed_tokens
            num_new = min(self._chunk_cap(remaining) + len(request.spec_token_ids), budget)
            if not self.config.enable_chunked_prefill and num_new < remaining:
                i += 1  # a whole prompt or nothing
                continue
            drafts = request.spec_token_ids[:max(num_new - remaining, 0)]  # as many as the budget takes
            while not self.block_manager.allocate_slots(request, num_new):
                victim, at = self._preempt_one(preempted)
                if victim is request:
                    return budget
                if at < i:  # passed earlier this step (priority policy only)
                    i -= 1
                    taken = next((c for c in chunks if c.request is victim), None)
                    if taken is not None:
                        chunks.remove(taken)
                        budget += taken.num_new_tokens
            chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new, drafts))
            budget -= num_new
            i += 1
        return budget

    def _chunk_cap(self, remaining: int) -> int:
        """The tokens of `remaining` a request may take this step before the budget's share."""
        cap = self.config.long_prefill_token_threshold
        return cap if 0 < cap < remaining else remaining

    def _preempt_one(self, preempted: list[str]) -> tuple[Request, int]:
        """Preempt the policy's victim; returns it and where it was in running."""
        at = len(self.running) - 1
        if self.config.policy == "priority":
            at = lowest_priority(self.running)
        victim = self.running.pop(at)
        self._preempt(victim)
        preempted.append(victim.request_id)
        return victim, at

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0  # recomputed on resumption; outputs are kept
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.requeue(request)

    def _schedule_waiting(self, budget: int, chunks: list[ScheduledChunk]) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            prefix = bm.get_computed_blocks(request)
            remaining = request.num_tokens - prefix.num_tokens
            num_new = min(self._chunk_cap(remaining), budget)
            if not self.config.enable_chunked_prefill and num_new < remaining:
                break
            # The whole remaining prompt must fit, not only this chunk: admitting a request
            # that will be preempted a few chunks later wastes the work done.
            if not bm.can_allocate(request, remaining, prefix):
                break
            if not bm.allocate_slots(request, num_new, prefix):
                raise AssertionError("allocate_slots failed after can_allocate succeeded")
            self.waiting.pop()
            request.num_computed_tokens = prefix.num_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = prefix.num_tokens
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
            budget -= num_new

    def _stop_status(self, request: Request) -> tuple[RequestStatus, int | None] | None:
        """(status, stop_reason) if the newest token ends the request; a stop token wins
        over length. EOS and stop token ids count only once min_tokens are out."""
        params = request.sampling_params
        token = request.output_token_ids[-1]
        if request.num_output_tokens >= params.min_tokens:
            if token == request.eos_token_id and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED, None
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if request.num_output_tokens >= request.max_tokens:
            return RequestStatus.FINISHED_LENGTH, None
        return None

    def _finish(self, request: Request, status: RequestStatus, now: float) -> None:
        """Mark finished and free its blocks; the caller removes it from running/waiting."""
        request.status = status
        request.finished_time = now
        self.block_manager.free(request)
        del self._requests[request.request_id]
        self._finished_ids.append(request.request_id)

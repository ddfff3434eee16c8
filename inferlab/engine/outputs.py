"""The contracts between scheduler, model runner and caller.

The scheduler decides, per step, how many tokens each request computes; the model
runner turns that into one flat batch and returns sampled tokens; the engine turns
finished steps into RequestOutputs for the caller.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from inferlab.engine.request import Request
from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions


@dataclass
class ScheduledChunk:
    """One request's share of a step."""

    request: Request
    # Tokens already in the KV cache before this step (prefix-cache hits included).
    num_computed_tokens: int
    # Tokens computed this step: request.all_token_ids[num_computed_tokens:] followed by
    # spec_token_ids, num_new_tokens in all.
    num_new_tokens: int
    # Draft tokens verified this step after the request's newest token (speculative decoding).
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the request's newest token, so a token is sampled."""
        return (self.num_computed_tokens + self.num_new_tokens - len(self.spec_token_ids)
                == self.request.num_tokens)

    @property
    def input_token_ids(self) -> list[int]:
        start = self.num_computed_tokens
        tokens = self.request.all_token_ids[start:start + self.num_new_tokens]
        return tokens + self.spec_token_ids if self.spec_token_ids else tokens


def attention_rows(chunks: list[ScheduledChunk]) -> tuple[list[int], list[int], list[list[int]]]:
    """(query lens, sequence lens, block tables) of the step's attention. A chunk with drafts is
    one decode row per token, each seeing its sequence up to itself: the step stays a batch of
    decodes, which the CPU runs in one C call and CUDA replays as a graph (on the CPU, a 5-token
    chunk as such took ~1.6x a 1-token decode step; as 5 decode rows, about as long as one)."""
    if not any(c.spec_token_ids for c in chunks):
        return ([c.num_new_tokens for c in chunks],
                [c.num_computed_tokens + c.num_new_tokens for c in chunks],
                [c.request.block_ids for c in chunks])
    query_lens, seq_lens, tables = [], [], []
    for c in chunks:
        end = c.num_computed_tokens + c.num_new_tokens
        if c.spec_token_ids:
            query_lens += [1] * c.num_new_tokens
            seq_lens += range(c.num_computed_tokens + 1, end + 1)
            tables += [c.request.block_ids] * c.num_new_tokens
        else:
            query_lens.append(c.num_new_tokens)
            seq_lens.append(end)
            tables.append(c.request.block_ids)
    return query_lens, seq_lens, tables


def flat_batch(chunks: list[ScheduledChunk], block_size: int, device: torch.device | str = "cpu",
               ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The step as the forward pass takes it: input ids [N] and positions [N] (int64, on the
    host) and the attention metadata (on `device`), a row per new token or draft."""
    query_lens, seq_lens, tables = attention_rows(chunks)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device)
    # list slices joined in C, not per token
    input_ids = torch.tensor(list(itertools.chain.from_iterable(c.input_token_ids for c in chunks)))
    return input_ids, token_positions(query_lens, seq_lens)[1], meta


@dataclass
class SchedulerOutput:
    """What the model runner computes this step."""

    # Running requests first, then newly admitted or resumed ones; this is the batch order.
    chunks: list[ScheduledChunk]
    # Sum of num_new_tokens over chunks; never above max_num_batched_tokens.
    total_num_scheduled_tokens: int
    # Requests preempted this step (their blocks are already freed).
    preempted_request_ids: list[str] = field(default_factory=list)
    # Requests finished or aborted since the last step; the runner drops any state it keeps.
    finished_request_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass
class Logprob:
    """vLLM's (vllm.logprobs.Logprob): one token's logprob at a position."""

    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None  # the token's text alone; None: not detokenized


@dataclass(eq=False)  # compared as the mapping it is, as vLLM's dicts are
class TokenLogprobs(Mapping[int, Logprob]):
    """The chosen token's logprob and the top-k alternatives at one position; also vLLM's
    dict[int, Logprob] of the position: token id -> Logprob, the chosen token first, then the
    top ones by rank (one the chosen token is among keeps its place and takes the top's rank,
    as vLLM's dict is built)."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]]  # (token id, logprob), most likely first
    # token id -> its text alone (decoded_token), set by the output processor where the request
    # is detokenized; looked up lazily, as a caller that reads only .top needs no text
    texts: Callable[[int], str] | None = field(default=None, repr=False)

    def __getitem__(self, token_id: int) -> Logprob:
        for rank, (t, lp) in enumerate(self.top, start=1):
            if t == token_id:
                return Logprob(lp, rank, self._text(t))
        if token_id == self.token_id:
            return Logprob(self.logprob, self.rank, self._text(token_id))
        raise KeyError(token_id)

    def __iter__(self) -> Iterator[int]:
        yield self.token_id
        yield from (t for t, _ in self.top if t != self.token_id)

    def __len__(self) -> int:
        return 1 + sum(t != self.token_id for t, _ in self.top)

    def _text(self, token_id: int) -> str | None:
        return None if self.texts is None else self.texts(token_id)


@dataclass
class ModelRunnerOutput:
    """What one step of the model runner produced."""

    # request_id -> the tokens the step outputs, for chunks whose `samples` is True: one, or
    # with drafts the ones kept and the token after them. The scheduler cuts a list at the
    # token that finishes its request.
    sampled_token_ids: dict[str, list[int]]
    # request_id -> logprobs of each sampled token, where the request asked for logprobs.
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # request_id -> (position of the first entry, logprobs of the prompt tokens computed this
    # step); position 0 has no logprob (None). A resumed request may send positions again.
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs | None]]] = field(default_factory=dict)
    # request_id -> why its guide failed this step (GuidedDecodingError): its tokens are not kept
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class CompletionOutput:
    """One of a request's n completions."""

    index: int
    text: str  # the whole text so far (stop string excluded)
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort", "error", or None while running
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None
    # Streaming: what is new since the previous RequestOutput of this request.
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: list[TokenLogprobs] | None = None
    # this completion's own timings: vLLM runs each of n completions as a request of its own,
    # and its per-request metrics count each
    metrics: RequestMetrics | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the sampled tokens' logprobs (vLLM's), when logprobs were asked for."""
        return None if self.logprobs is None else sum(lp.logprob for lp in self.logprobs)


@dataclass
class RequestMetrics:
    """Per-request timestamps (time.monotonic seconds) and derived latencies. arrival_time is
    when the request reached the engine's frontend (AsyncEngine, or LLMEngine's add), before
    its prompt was encoded; queued_time when the scheduler queued it, as in vLLM, whose queue
    time starts at its engine core's QUEUED event and its TTFT and e2e at the arrival."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0  # all n completions'
    longest_completion_tokens: int = 0
    queued_time: float | None = None
    max_tokens: int | None = None  # as the engine resolved it, fitted to the context (vLLM's max_tokens_param)

    @property
    def queue_time_s(self) -> float | None:
        return _span(self.queued_time, self.first_scheduled_time)

    @property
    def ttft_s(self) -> float | None:
        return _span(self.arrival_time, self.first_token_time)

    @property
    def e2e_latency_s(self) -> float | None:
        return _span(self.arrival_time, self.finished_time)

    @property
    def prefill_time_s(self) -> float | None:
        """First scheduled to first token: the prompt's computation, chunks and waits included."""
        return _span(self.first_scheduled_time, self.first_token_time)

    @property
    def decode_time_s(self) -> float | None:
        return _span(self.first_token_time, self.last_token_time)

    @property
    def inference_time_s(self) -> float | None:
        """First scheduled to last token (vLLM's time in the running phase)."""
        return _span(self.first_scheduled_time, self.last_token_time)

    @property
    def mean_tpot_s(self) -> float | None:
        """Decode time over the tokens after the first (vLLM's time per output token): of the
        longest completion, as the n completions of a request decode side by side."""
        decode = self.decode_time_s
        if decode is None or self.longest_completion_tokens < 2:
            return None
        return decode / (self.longest_completion_tokens - 1)


def _span(start: float | None, end: float | None) -> float | None:
    """end - start, or None until both have happened."""
    return None if start is None or end is None else end - start


@dataclass
class RequestOutput:
    """What the caller sees of a request: all its completions so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    error: str | None = None  # why it failed, where its completions finished with "error"

"""The engine's totals since start, counted when vLLM counts them, and the snapshot of them and
the scheduler's counts that /metrics and backpressure read."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from inferlab.engine.outputs import RequestOutput
from inferlab.engine.request import Request
from inferlab.engine.scheduler import SchedulerStats
from inferlab.engine.spec_decode import SpecDecodeCounters


@dataclass
class EngineCounters:
    # prompts whose prefill is done, not prompts queued: a request aborted (or refused) before
    # its prefill ends adds nothing, as in vLLM
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = dataclasses.field(default_factory=dict)  # by finish reason

    def count_prefills(self, updated: Iterable[Request]) -> None:
        """The prompts of the requests a step gave their first token (their prefill is done:
        a prefill step samples one token, and a preempted request resumes with its tokens).
        Each of n copies counts the prompt: vLLM runs each as a child request of its own."""
        for request in updated:
            if request.num_output_tokens == 1:
                self.prompt_tokens += request.num_prompt_tokens

    def count_finished(self, output: RequestOutput) -> None:
        """The completions of a finished request, by finish reason, but for those aborted:
        only a caller aborts (a client gone, a shutdown's deadline), and vLLM's frontend drops
        an aborted request unrecorded. A sibling that ended before the abort counts."""
        for completion in output.outputs:
            reason = completion.finish_reason
            if reason is not None and reason != "abort":
                self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and backpressure; token and request totals count since start."""

    # requests, KV blocks, prefix cache, preemptions; num_waiting is the last step's count
    # less the requests aborted since (those added since count from the step that sees them)
    scheduler: SchedulerStats
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished: dict[str, int]  # by finish reason: stop, length, error (never abort)
    spec_decode: SpecDecodeCounters | None = None  # with speculative decoding on

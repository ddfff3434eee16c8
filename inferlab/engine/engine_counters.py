"""The engine's totals since start, for /metrics, counted when vLLM counts them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from inferlab.engine.outputs import RequestOutput
from inferlab.engine.request import Request


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
        for completion in output.outputs:
            reason = completion.finish_reason or "abort"
            self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

"""How much work one engine step may take on."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.engine.request_queue import SCHEDULING_POLICIES
from inferlab.errors import InferlabError


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-step limits of the scheduler; max_model_len has no default (it comes from the model)."""

    max_model_len: int  # prompt + output tokens of one request, at most
    max_num_seqs: int = 256  # requests in one step's batch, at most
    max_num_batched_tokens: int = 2048  # tokens computed in one step, all requests together
    enable_chunked_prefill: bool = True  # split long prompts across steps
    policy: str = "fcfs"  # the waiting queue's order and the preemption victim (request_queue.py)
    # a prompt longer than this takes at most this many tokens a step (0: no cap), so that one
    # long prompt leaves budget to the shorter ones queued behind it (vLLM's name)
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise InferlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise InferlabError(f"long_prefill_token_threshold must be at least 0 (0: no cap), got "
                                f"{self.long_prefill_token_threshold}")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise InferlabError("long_prefill_token_threshold caps a prompt's chunks: it needs "
                                "chunked prefill")
        if self.policy not in SCHEDULING_POLICIES:
            raise InferlabError(f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                                f"got {self.policy!r}")
        # Decodes come first, a token each: a budget below the batch would leave the requests
        # past it waiting for others to finish (vLLM refuses it with these words).
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InferlabError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or"
                f" equal to max_num_seqs ({self.max_num_seqs})")
        # Without chunking a prompt is computed in one step, so the longest one must fit a step.
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InferlabError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens})"
                f" must be at least max_model_len ({self.max_model_len}): raise the one or "
                f"lower the other")

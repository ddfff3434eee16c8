"""How much work one engine step may take on."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.errors import InferlabError


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-step limits of the scheduler; max_model_len has no default (it comes from the model)."""

    max_model_len: int  # prompt + output tokens of one request, at most
    max_num_seqs: int = 256  # requests in one step's batch, at most
    max_num_batched_tokens: int = 2048  # tokens computed in one step, all requests together
    enable_chunked_prefill: bool = True  # split long prompts across steps

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise InferlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        # Without chunking a prompt is computed in one step, so the longest one must fit a step.
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InferlabError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens})"
                f" must be at least max_model_len ({self.max_model_len})")

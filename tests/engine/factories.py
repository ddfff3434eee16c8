"""Small builders for scheduler and block-manager tests: requests from token ids, no weights."""

from __future__ import annotations

import itertools

from inferlab.engine.kv_cache_config import CacheConfig
from inferlab.engine.outputs import ModelRunnerOutput, SchedulerOutput
from inferlab.engine.request import Request
from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.scheduler import Scheduler
from inferlab.engine.scheduler_config import SchedulerConfig

_fresh_tokens = itertools.count(1000)


def make_request(request_id: str, prompt_token_ids: list[int] | int, max_tokens: int = 16,
                 eos_token_id: int | None = None, priority: int = 0,
                 **sampling: object) -> Request:
    """A request; an int prompt means that many tokens never used before (no prefix hits)."""
    if isinstance(prompt_token_ids, int):
        prompt_token_ids = [next(_fresh_tokens) for _ in range(prompt_token_ids)]
    params = SamplingParams(max_tokens=max_tokens, **sampling)
    return Request(request_id, list(prompt_token_ids), params, eos_token_id=eos_token_id,
                   max_tokens=max_tokens, priority=priority)


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int = 64, max_model_len: int = 256,
                   enable_chunked_prefill: bool = True,
                   enable_prefix_caching: bool = True, policy: str = "fcfs",
                   long_prefill_token_threshold: int = 0) -> Scheduler:
    """max_num_seqs: by default 16, or the step budget where that is smaller."""
    if max_num_seqs is None:
        max_num_seqs = min(16, max_num_batched_tokens)
    return Scheduler(
        SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens,
                        enable_chunked_prefill=enable_chunked_prefill, policy=policy,
                        long_prefill_token_threshold=long_prefill_token_threshold),
        CacheConfig(block_size=block_size, num_blocks=num_blocks,
                    enable_prefix_caching=enable_prefix_caching),
    )


def run_output(output: SchedulerOutput, token_id: int = 7) -> ModelRunnerOutput:
    """What a model runner would return: `token_id` for every chunk that samples."""
    return ModelRunnerOutput({c.request.request_id: [token_id] for c in output.chunks if c.samples})


def chunk_sizes(output: SchedulerOutput) -> dict[str, int]:
    """request_id -> tokens scheduled this step."""
    return {c.request.request_id: c.num_new_tokens for c in output.chunks}

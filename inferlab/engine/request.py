"""A request as the scheduler sees it, and its status state machine.

WAITING -> RUNNING -> FINISHED_*; RUNNING -> PREEMPTED -> RUNNING (recomputed);
any unfinished state -> FINISHED_ABORTED.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inferlab.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the scheduler side of the engine runs without torch (inferlab bench, plan)
    import torch


# The token id the sampler gives a row whose request's constraints (allowed_token_ids, bad_words,
# min_tokens) leave no token to sample: the request ends there with finish_reason "stop", and
# the position is never output (output_processor drops it). A guide with no way on fails its
# request instead (finish_reason "error"): the output it holds to is not whole.
NO_TOKEN = -1


class Guide(Protocol):
    """Guided decoding's per-request state (guided.guided_choice.ChoiceGuide,
    guided.token_filter.GrammarGuide)."""

    def allowed_now(self, output: list[int], drafts: Sequence[int] = ()) -> list[int] | torch.Tensor:
        """The token ids the next token may be (a list, or a bool mask over the vocabulary),
        given the output so far and, as if kept, speculative drafts after it (which do not move
        the guide: they may be rejected)."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # its guide failed (GuidedDecodingError); RequestOutput.error says why

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI finish_reason for a finished status, None otherwise."""
        return self.value if self.finished else None


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
             RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR}


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    max_tokens: int = 16  # resolved by the engine from sampling_params and max_model_len
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # under the "priority" scheduling policy: lower values go first
    # The parent id of an n > 1 request's copies: they share the prompt's KV blocks, with
    # prefix caching on or off (off, they share them with nothing else).
    prompt_group: str | None = None
    # sampling_params.bad_words as token ids (bad_words.bad_words_token_ids)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    # guided decoding (a ChoiceGuide or a GrammarGuide): allowed_now(output ids, drafts) -> what may come next
    guide: Guide | None = None

    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache (computed or served from the prefix cache).
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # KV block ids, in sequence order: the request's block table.
    block_ids: list[int] = field(default_factory=list)
    # Prompt tokens served by the prefix cache at first admission.
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    stop_reason: int | str | None = None  # the stop token id or stop string that finished it
    # Draft tokens (speculative decoding) to verify after its newest token at the next step;
    # they are not output tokens until a step accepts them.
    spec_token_ids: list[int] = field(default_factory=list)

    # when the scheduler queued it (vLLM's QUEUED event), on the engine thread: the queue time
    # starts here, not at arrival, which the frontend stamps before the prompt is encoded
    queued_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    def __post_init__(self) -> None:
        self._all_token_ids = list(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output; the list is shared, do not mutate it."""
        return self._all_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status.finished

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop the output after its first num_output_tokens (a stop string ended it there)."""
        del self.output_token_ids[num_output_tokens:]
        del self._all_token_ids[self.num_prompt_tokens + num_output_tokens:]

    def append_output_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now

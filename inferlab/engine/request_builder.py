"""A request as the scheduler takes it: its prompt read and checked, its bad words and choices
encoded, its max_tokens fitted to the context, refused (InferlabError) if it can never be served,
and its n copies, each with a guide of its own."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from inferlab.engine.bad_words import bad_words_token_ids
from inferlab.engine.context_room import output_room, over_context
from inferlab.engine.generation_defaults import GenerationDefaults
from inferlab.engine.guided.guided_choice import ChoiceGuide, choice_token_ids
from inferlab.engine.guided.token_filter import GrammarFilters
from inferlab.engine.guided.token_index import token_index
from inferlab.engine.prompt_reader import PromptReader
from inferlab.engine.request import Guide, Request
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, InvalidParameterError


class RequestBuilder:
    def __init__(self, prompts: PromptReader, generation: GenerationDefaults,
                 scheduling_policy: str) -> None:
        self.prompts = prompts
        # the prompt reader's: the tokenizer, the model's rows, the context a request must fit in
        self.tokenizer, self.vocab_size = prompts.tokenizer, prompts.vocab_size
        self.max_model_len = prompts.max_model_len
        self.generation = generation
        self.scheduling_policy = scheduling_policy

    def build(self, request_id: str, prompt: str | Sequence[int], prompt_text: str | None,
              params: SamplingParams, arrival: float, priority: int,
              cap_max_tokens: bool) -> tuple[str | None, list[Request]]:
        """(the prompt's text, its n copies as requests), checked as the scheduler would."""
        params = self.generation.with_end_tokens(params)
        text, ids = self.prompts.read(prompt, prompt_text, params.truncate_prompt_tokens)
        bad_words = _encoded("bad_words", bad_words_token_ids, self.tokenizer, params.bad_words)
        choices = _encoded("guided_choice", choice_token_ids, self.tokenizer, params.guided_choice or [])
        max_tokens = self._check_servable(ids, params, bad_words, choices, cap_max_tokens)
        children = []
        for i in range(params.n):
            child_params = params
            if params.n > 1:  # a copy, not replace(): seed -2's second copy keeps seed -1, which
                child_params = copy.copy(params)  # as a request's own seed would mean none
                child_params.n, child_params.seed = 1, None if params.seed is None else params.seed + i
            child_id = request_id if params.n == 1 else f"{request_id}#{i}"
            children.append(Request(child_id, ids, child_params, self.generation.eos_token_id,
                                    max_tokens, arrival_time=arrival, priority=priority,
                                    prompt_group=request_id if params.n > 1 else None,
                                    bad_words_token_ids=bad_words, guide=self.guide(params, choices)))
        return text, children

    def guide(self, params: SamplingParams, choices: list[list[int]]) -> Guide | None:
        """A new guide for one request (each of n copies has its own place in the grammar)."""
        if params.grammar is not None:
            return self.grammar_filters.guide(*params.grammar, after=params.guide_after_thinking)
        if choices and params.guide_after_thinking is not None:  # a choice among texts, as a pattern
            pattern = "|".join(re.escape(choice) for choice in params.guided_choice or ())
            return self.grammar_filters.guide("regex", pattern, after=params.guide_after_thinking)
        return ChoiceGuide(choices, self.generation.eos_token_id) if choices else None

    @functools.cached_property
    def grammar_filters(self) -> GrammarFilters:
        return GrammarFilters(lambda: token_index(self.tokenizer, self.vocab_size),
                              self.generation.eos_token_id)

    def check_priority(self, priority: int) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidParameterError(f"priority must be an integer, got {priority!r}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise InvalidParameterError(f"priority {priority} needs the priority scheduling policy "
                                        "(--scheduling-policy priority)")

    def _check_servable(self, ids: list[int], params: SamplingParams, bad_words: list[list[int]],
                        choices: list[list[int]], cap_max_tokens: bool) -> int:
        """The request's max_tokens; raises InferlabError if it can never be served."""
        vocab = self.vocab_size
        for name, tokens in (("logit_bias", params.logit_bias or ()),
                             ("allowed_token_ids", params.allowed_token_ids or ()),
                             ("stop_token_ids", params.stop_token_ids),
                             ("bad_words", [t for word in bad_words for t in word]),
                             ("guided_choice", [t for choice in choices for t in choice])):
            outside = [t for t in tokens if t >= vocab]
            if outside:  # the sampler would index past the logits mid-step (it killed the loop)
                raise InvalidParameterError(f"{name} token id {outside[0]} is outside the "
                                            f"vocabulary (0..{vocab - 1})")
        never = {word[0] for word in bad_words if len(word) == 1}
        eos = self.generation.eos_token_id
        if params.guided_by and eos is None:
            raise InvalidParameterError(f"{params.guided_by} ends its output with EOS, and this "
                                        "model has none")
        held = set(params.stop_token_ids) | ({eos} if not params.ignore_eos else set())
        if params.allowed_token_ids and (never | (held if params.min_tokens else set())).issuperset(
                params.allowed_token_ids):
            raise InvalidParameterError("allowed_token_ids leave nothing to sample: every one of them "
                                        "is a bad word, or a stop token or EOS before min_tokens")
        room = output_room(len(ids), self.max_model_len)
        max_tokens = self.generation.max_tokens(params, room)
        if max_tokens <= room or cap_max_tokens:  # capped: the scheduler ends it at the context
            return min(max_tokens, room)  # with "length", as vLLM's offline engine ends it
        raise over_context(len(ids), max_tokens, self.max_model_len)  # as vLLM's server refuses it


def _encoded(field: str, encode: Callable[..., list[list[int]]], *args: Any) -> list[list[int]]:
    """encode(*args), texts a request field gave; text the tokenizer refuses (a lone surrogate,
    which JSON's "\\ud800" makes) is refused naming the field."""
    try:
        return encode(*args)
    except InferlabError as e:
        raise InvalidParameterError(f"{field}: {e}") from None

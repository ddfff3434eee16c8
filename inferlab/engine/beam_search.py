"""Beam search as vLLM runs it: outside the sampler, one engine request per beam per token.

Each round asks the engine for one greedy token of every live beam with the top 2 x width
log-probabilities. Every beam's candidates go on with their cumulative logprob; a candidate
that is an end token (EOS, or an end id of the model's generation config) is set aside as
finished, unless ignore_eos. The best `width` others are the next round's beams. After
max_tokens rounds (or when no beam is left) the finished and live beams are ranked by vLLM's
score, cumulative logprob / length ** length_penalty (the length counts the prompt and not a
final end token), and the best `width` are the answer; the scores are compared through their
logarithms, so no length_penalty overflows them. The beams share the prompt and their
common past through the prefix cache (under the request's cache_salt, as any request), so a
round recomputes about a block of each beam.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from inferlab.engine.context_room import output_room, over_context
from inferlab.engine.field_types import check_field_types
from inferlab.engine.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError
from inferlab.models.tokenizer import TextTokenizer


@dataclass
class BeamSearchSequence:
    """A beam as vLLM's LLM.beam_search returns it: its tokens and its text with the prompt's."""

    tokens: list[int]
    text: str
    cum_logprob: float
    logprobs: list[TokenLogprobs]
    finish_reason: str


@dataclass
class BeamSearchOutput(RequestOutput):
    """A search's result in both shapes: the beams as `outputs` (completions, as the server
    sends them as choices) and vLLM's `sequences`, best first."""

    sequences: list[BeamSearchSequence] = field(default_factory=list)

MAX_BEAM_WIDTH = 10  # a round asks for 2 x width logprobs, and the engine gives at most 20
# beyond ~1e16 the penalty's term swamps the logprob's in a float64 score and every beam ties
MAX_LENGTH_PENALTY = 1e6


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int | None = None  # None: to the context's end
    ignore_eos: bool = False
    # vLLM's: its rounds' candidates are the model's own top logprobs, whatever the temperature
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # a beam's text keeps the end token's own text
    logprobs: int | None = None  # each output token's top k alternatives too (k <= 20)
    # as a request's (SamplingParams'): the prompt's last k tokens only (-1: the context's);
    # the salt under which every round shares cached blocks; the text without special tokens
    truncate_prompt_tokens: int | None = None
    cache_salt: str | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        check_field_types(self)
        checks = [
            (1 <= self.beam_width <= MAX_BEAM_WIDTH,
             f"beam_width must be in [1, {MAX_BEAM_WIDTH}] (the number of beams), got {self.beam_width}"),
            (self.max_tokens is None or self.max_tokens >= 1,
             f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.logprobs is None or 0 <= self.logprobs <= 20,
             f"logprobs must be in [0, 20], got {self.logprobs}"),
            (abs(self.length_penalty) <= MAX_LENGTH_PENALTY,
             f"length_penalty must be a number from -{MAX_LENGTH_PENALTY:g} to "
             f"{MAX_LENGTH_PENALTY:g}, got {self.length_penalty}"),
            (self.temperature >= 0.0 and math.isfinite(self.temperature),
             f"temperature must be a finite number >= 0, got {self.temperature}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidParameterError(message)
        # the fields a request has too are checked as a request's are
        SamplingParams(truncate_prompt_tokens=self.truncate_prompt_tokens, cache_salt=self.cache_salt)

    def round_params(self) -> SamplingParams:
        """What the engine is asked for each beam in a round: the model's own top 2 x width
        (or the top k asked for, if more)."""
        top = max(2 * self.beam_width, self.logprobs or 0)
        return SamplingParams(temperature=0.0, max_tokens=1, logprobs=top, ignore_eos=True,
                              detokenize=False, cache_salt=self.cache_salt)


@dataclass
class _Beam:
    tokens: list[int]  # the prompt's and the output's
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    ended: bool = False  # its last token is an end token


class BeamSearch:
    """One prompt's search: `beams()` are the token lists to extend by one token, `advance()`
    takes the engine's answer for each, in order; `output()` once `done`."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, end_ids: set[int],
                 max_model_len: int) -> None:
        room = output_room(len(prompt_ids), max_model_len)
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if max_tokens > room:
            raise over_context(len(prompt_ids), max_tokens, max_model_len)
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.end_ids = set() if params.ignore_eos else end_ids
        self.live = [_Beam(list(prompt_ids))]
        self.finished: list[_Beam] = []
        self.rounds = 0
        self.num_cached_tokens = 0  # the prompt's tokens the prefix cache served

    @property
    def done(self) -> bool:
        return not self.live or self.rounds >= self.max_tokens

    def beams(self) -> list[list[int]]:
        return [beam.tokens for beam in self.live]

    def advance(self, outputs: list[RequestOutput]) -> None:
        candidates = []
        for beam, out in zip(self.live, outputs, strict=True):
            (step,) = out.outputs[0].logprobs or ()  # one token, with the top 2 x width
            # the candidates are the top 2 x width (the round gives more when logprobs asks);
            # a token's reported alternatives, the logprobs asked for (none: none)
            reported = step.top[:self.params.logprobs or 0]
            for rank, (token, logprob) in enumerate(step.top[:2 * self.params.beam_width], 1):
                grown = _Beam([*beam.tokens, token],
                              [*beam.logprobs, TokenLogprobs(token, logprob, rank, reported)],
                              beam.cumulative_logprob + logprob, token in self.end_ids)
                (self.finished if grown.ended else candidates).append(grown)
        self.live = sorted(candidates, key=self._score, reverse=True)[:self.params.beam_width]
        if self.rounds == 0:  # the one beam is the prompt: its hits are those a request reports
            self.num_cached_tokens = outputs[0].num_cached_tokens  # (later, the search's own blocks)
        self.rounds += 1

    def output(self, request_id: str, tokenizer: TextTokenizer, prompt: str | None,
               texts: Callable[[int], str]) -> BeamSearchOutput:
        """The best beams, best first, as the completions of one request and as vLLM's
        sequences; `texts`: each token's text alone (the engine's cached decoded_token), as the
        rounds ran undetokenized."""
        best = sorted(self.finished + self.live, key=self._score, reverse=True)
        completions, sequences = [], []
        for index, beam in enumerate(best[:self.params.beam_width]):
            for entry in beam.logprobs:
                entry.texts = texts
            token_ids = beam.tokens[len(self.prompt_ids):]
            cut = beam.ended and not self.params.include_stop_str_in_output  # the end token's text
            text = tokenizer.decode(token_ids[:len(token_ids) - cut],
                                    skip_special_tokens=self.params.skip_special_tokens)
            # the only output of the search: all of it is new (a stream sends it in one piece)
            completions.append(CompletionOutput(
                index=index, text=text, token_ids=token_ids,
                finish_reason="stop" if beam.ended else "length", logprobs=beam.logprobs,
                text_delta=text, token_ids_delta=token_ids, logprobs_delta=beam.logprobs))
            sequences.append(BeamSearchSequence(
                beam.tokens, tokenizer.decode(beam.tokens, self.params.skip_special_tokens),
                beam.cumulative_logprob, beam.logprobs, completions[-1].finish_reason))
        return BeamSearchOutput(request_id=request_id, prompt=prompt, prompt_token_ids=self.prompt_ids,
                                outputs=completions, finished=True,
                                num_cached_tokens=self.num_cached_tokens, sequences=sequences)

    def _score(self, beam: _Beam) -> float:
        """A key in the order of vLLM's score, c / length ** penalty for the cumulative logprob
        c <= 0: -log(-c / length ** penalty), which a penalty of +-1000 does not overflow (the
        power did, and failed the request); c = 0 scores best."""
        length = len(beam.tokens) - beam.ended
        if beam.cumulative_logprob >= 0.0:
            return math.inf
        return self.params.length_penalty * math.log(length) - math.log(-beam.cumulative_logprob)

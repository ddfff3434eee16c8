"""Per-request sampling and stopping parameters, validated when built."""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferlab.engine.field_types import check_field_types
from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.json_schema import OBJECT_SCHEMA, compile_schema
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.structural_tag import StructuralTagGrammar
from inferlab.engine.structured_outputs import StructuredOutputsParams, as_structured_outputs
from inferlab.errors import InvalidParameterError

# the fields that guide decoding, one per request at most
GUIDES = ("guided_choice", "json_object", "json_schema", "guided_regex", "guided_grammar", "structural_tag")
# torch.Generator.manual_seed's range; outside it the sampler would fail in the middle of a step
SEED_MIN, SEED_END = -2**63, 2**64


def check_seed(seed: int | None, copies: int = 1) -> None:
    """Raise InvalidParameterError unless seed, seed + 1, ..., seed + copies - 1 are valid."""
    if seed is not None and not SEED_MIN <= seed <= SEED_END - copies:
        raise InvalidParameterError(f"seed must be in [-2**63, 2**64 - {copies}], got {seed}"
                                    + (f" (the {copies} copies use seed, seed + 1, ...)"
                                       if copies > 1 else ""))


# vLLM's _SAMPLING_EPS: a temperature this small is greedy (1 / t past fp32's range would make
# every weight NaN, and a draw fall on token 0)
GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    """What to sample and when to stop; names follow vLLM and the OpenAI API."""

    n: int = 1  # independent completions; the copies share the prompt's KV blocks
    max_tokens: int | None = 16  # None: up to max_model_len
    # before this many output tokens, EOS and stop token ids cannot be sampled and stop strings
    # do not end the output (vLLM's rule)
    min_tokens: int = 0
    temperature: float = 1.0  # below GREEDY_BELOW (0 included): greedy
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages tokens seen in prompt or output
    presence_penalty: float = 0.0  # subtracted once from logits of tokens seen in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    # same seed, same draws: the same tokens whatever else is in the batch where the logits are
    # batch invariant too (bf16 on the C kernels; README), not in fp32, whose matmuls are not
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings, not in the output unless:
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k
    prompt_logprobs: int | None = None  # None: none; k: logprob of each prompt token and top k
    # token id -> added to its logit before penalties and sampling (OpenAI's and vLLM's); the
    # reported logprobs stay the model's own
    logit_bias: dict[int, float] | None = None
    # the tokens to sample from (vLLM's allowed_token_ids), None: all
    allowed_token_ids: list[int] | None = None
    # keep only the prompt's last k tokens; -1: as many as the context holds (vLLM's)
    truncate_prompt_tokens: int | None = None
    # words never to write (vLLM's bad_words): a word's last token is barred when the output
    # ends with the tokens before it
    bad_words: list[str] = field(default_factory=list)
    detokenize: bool = True
    skip_special_tokens: bool = True  # in the output text (<|im_end|> and the like)
    # vLLM's guided_choice: the output is one of these strings, then EOS (guided/guided_choice.py)
    guided_choice: list[str] | None = None
    # OpenAI's json_object response format: the output is one JSON object, then EOS
    # (guided/json_grammar.py)
    json_object: bool = False
    # OpenAI's json_schema response format and vLLM's guided_json: the output is one JSON value
    # the schema takes, then EOS (guided/json_schema.py says which keywords are held to)
    json_schema: dict[str, Any] | bool | None = None
    # vLLM's structured_outputs disable_any_whitespace: JSON guides take no whitespace between
    # tokens, so the output is compact JSON
    disable_any_whitespace: bool = False
    # (opener, closer) of a reasoning model's thinking: the guide holds the answer after it, as
    # vLLM's structured outputs do with a reasoning parser (guided/thinking_grammar.py); opener
    # None: the reply starts inside the thinking (R1), else it may open with it or answer at once
    guide_after_thinking: tuple[str | None, str] | None = None
    # vLLM's guided_regex: the whole output matches the pattern, then EOS (guided/regex_grammar.py)
    guided_regex: str | None = None
    # vLLM's guided_grammar: the output is a whole `root` of this EBNF grammar (llama.cpp's GBNF
    # notation), then EOS (guided/ebnf_parse.py)
    guided_grammar: str | None = None
    # vLLM's structural_tag: free text in which each structure's begin is followed by JSON its
    # schema takes and its end, watched for the triggers (guided/structural_tag.py)
    structural_tag: dict[str, Any] | None = None
    # vLLM's cache_salt: cached prefix blocks are shared only among requests with the same salt,
    # so that one tenant cannot time its way to another's prompts
    cache_salt: str | None = None
    # vLLM's grouped guide (a StructuredOutputsParams or a dict of its fields), or the same by
    # its older name: taken into the fields above when built, then None, so that a copy
    # (dataclasses.replace) does not give the guide twice
    structured_outputs: StructuredOutputsParams | dict[str, Any] | None = None
    guided_decoding: StructuredOutputsParams | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._take_structured_outputs()
        self._validate(with_grammars=True)

    def _take_structured_outputs(self) -> None:
        """structured_outputs' (or guided_decoding's) guide into the separate fields, refused
        beside one of them: the guide is given one way."""
        given = {name: value for name, value in (("structured_outputs", self.structured_outputs),
                                                 ("guided_decoding", self.guided_decoding))
                 if value is not None}
        self.structured_outputs = self.guided_decoding = None
        if len(given) > 1:
            raise InvalidParameterError("structured_outputs and guided_decoding (its older name) "
                                        "cannot be combined")
        if not given:
            return
        name, value = next(iter(given.items()))
        grouped = as_structured_outputs(value, name)
        separate = [guide for guide in GUIDES if self._guides_by(guide)]
        if separate:
            raise InvalidParameterError(f"{name} cannot be combined with {' and '.join(separate)}: "
                                        "give the guide one way")
        for field_name, field_value in grouped.guide_fields().items():
            setattr(self, field_name, field_value)

    def checked_copy(self, **changes: Any) -> SamplingParams:
        """A copy with `changes`, checked again: a request's own at the add (a caller may change
        or reuse its object afterwards; vLLM clones the params there). Its guide is not compiled
        again: the add builds the guide itself, from a cache of compiled grammars, and refuses
        it there (dataclasses.replace would compile it once more)."""
        params = copy.copy(self)
        for name, value in changes.items():
            setattr(params, name, value)
        params._validate(with_grammars=False)  # _normalize gives it lists of its own
        return params

    def _validate(self, with_grammars: bool) -> None:
        check_field_types(self)
        self._normalize()
        for ok, message in self._checks(with_grammars):
            if not ok:
                raise InvalidParameterError(message)
        check_seed(self.seed, self.n)
        # numpy's integers and floats pass the checks; the engine keeps Python's (torch's
        # manual_seed takes no numpy integer: a step's TypeError once ended every request)
        if self.seed is not None:
            self.seed = int(self.seed)
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.logit_bias is not None:
            self.logit_bias = {int(t): float(v) for t, v in self.logit_bias.items()}

    def _normalize(self) -> None:
        """vLLM's other spellings to one: a single stop as a list, top_k -1 as 0, seed -1 as none."""
        self.stop = _as_list(self.stop, "stop")
        self.stop_token_ids = _as_list(self.stop_token_ids, "stop_token_ids")
        self.bad_words = _as_list(self.bad_words, "bad_words")
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:  # vLLM's: -1 asks for no seed
            self.seed = None
        if self.logit_bias and not isinstance(self.logit_bias, Mapping):
            raise InvalidParameterError(f"logit_bias must be a mapping of token ids to biases, got "
                                        f"{self.logit_bias!r}")
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _as_list(self.allowed_token_ids, "allowed_token_ids")
        if self.guided_choice is not None and not isinstance(self.guided_choice, str):
            self.guided_choice = _as_list(self.guided_choice, "guided_choice")

    def _checks(self, with_grammars: bool) -> list[tuple[bool, str]]:
        """(holds, the error if not) for each rule on the normalized fields; with_grammars: also
        whether each guide's grammar compiles."""
        guides = [name for name in GUIDES if self._guides_by(name)]
        return [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.max_tokens is None or self.max_tokens >= 1,
             f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (0 <= self.temperature < math.inf,
             f"temperature must be a finite number >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be -1, 0 or positive, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (0 < self.repetition_penalty < math.inf,  # inf makes a 0 logit 0 * inf = NaN
             f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"),
            (-2 <= self.presence_penalty <= 2,
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.logprobs is None or 0 <= self.logprobs <= 20,
             f"logprobs must be in [0, 20], got {self.logprobs}"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
             f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}"),
            (all(isinstance(s, str) and s for s in self.stop),
             f"stop must be non-empty strings, got {self.stop!r}"),
            (self.detokenize or not self.stop, "stop strings need detokenize (they are looked for "
             "in the text)"),
            (all(_is_token_id(t) for t in self.stop_token_ids),
             f"stop_token_ids must be token ids, got {self.stop_token_ids!r}"),
            (all(isinstance(w, str) and w.strip() for w in self.bad_words),
             f"bad_words must be strings, not empty or blank, got {self.bad_words!r}"),
            *_logit_bias_checks(self.logit_bias or {}),
            (self.allowed_token_ids is None or (bool(self.allowed_token_ids) and all(
                _is_token_id(t) for t in self.allowed_token_ids)),
             f"allowed_token_ids must be a non-empty list of token ids, got {self.allowed_token_ids!r}"),
            (self.guided_choice is None or (isinstance(self.guided_choice, list)
                                            and bool(self.guided_choice) and all(
                isinstance(c, str) and c for c in self.guided_choice)),
             f"guided_choice must be a non-empty list of non-empty strings, got {self.guided_choice!r}"),
            (len(guides) < 2, f"{' and '.join(guides)} cannot be combined"),
            (self.guide_after_thinking is None or (bool(guides) and _thinking_markers(
                self.guide_after_thinking)), "guide_after_thinking must be (opener or None, "
             f"closer) texts, with a guide, got {self.guide_after_thinking!r}"),
            *(_grammar_checks(self.json_schema, self.guided_regex, self.guided_grammar, self.structural_tag)
              if with_grammars else ()),
            (self.guided_by is None or not (self.ignore_eos or self.min_tokens or self.bad_words
                                            or self.allowed_token_ids is not None),
             f"{self.guided_by} ends at EOS and decides what may be sampled: it cannot be combined "
             "with ignore_eos, min_tokens, bad_words or allowed_token_ids"),
            (self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1
             or self.truncate_prompt_tokens == -1,
             f"truncate_prompt_tokens must be at least 1 (or -1: the context length), got "
             f"{self.truncate_prompt_tokens}"),
            (self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt != ""),
             "cache_salt must be a non-empty string"),
        ]

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def guided_by(self) -> str | None:
        """The field whose guided decoding decides what may be sampled and ends it at EOS
        (one at most: __post_init__ refuses two)."""
        return next((name for name in GUIDES if self._guides_by(name)), None)

    def _guides_by(self, name: str) -> bool:
        value = getattr(self, name)
        return bool(value) if name == "json_object" else value is not None

    @property
    def guided_schema(self) -> dict[str, Any] | bool | None:
        """The schema the output is held to: json_schema's, any object for json_object."""
        return OBJECT_SCHEMA if self.json_object else self.json_schema

    @property
    def grammar(self) -> tuple[str, Any] | None:
        """The grammar the output is held to, as guided.token_filter.GrammarFilters names it:
        ("json" or "compact_json", schema), ("regex", pattern), ("ebnf", grammar text),
        ("structural_tag", spec), or None."""
        if self.guided_schema is not None:
            return ("compact_json" if self.disable_any_whitespace else "json", self.guided_schema)
        if self.guided_regex is not None:
            return ("regex", self.guided_regex)
        if self.structural_tag is not None:
            return ("structural_tag", self.structural_tag)
        return None if self.guided_grammar is None else ("ebnf", self.guided_grammar)

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


def _logit_bias_checks(bias: dict[int, float]) -> list[tuple[bool, str]]:
    """One (ok, message) per entry that is not a token id with a bias in [-100, 100]; the
    engine checks the ids against its vocabulary."""
    checks = []
    for token, value in bias.items():
        checks.append((_is_token_id(token),
                       f"logit_bias keys must be token ids (integers >= 0), got {token!r}"))
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        checks.append((number and -100 <= value <= 100,  # NaN fails too
                       f"logit_bias values must be numbers in [-100, 100], got {value!r} for "
                       f"token {token!r}"))
    return checks


def _grammar_checks(schema: dict[str, Any] | bool | None, regex: str | None, grammar: str | None,
                    tag: dict[str, Any] | None) -> list[tuple[bool, str]]:
    """One (ok, message) for each grammar that guided decoding cannot hold an output to."""
    checks = []
    for name, build, spec in (("json_schema", compile_schema, schema), ("guided_regex", RegexGrammar, regex),
                              ("guided_grammar", EbnfGrammar, grammar),
                              ("structural_tag", StructuralTagGrammar, tag)):
        if spec is None:
            continue
        try:
            build(spec)
        except ValueError as e:  # ours, or Python's (an int past 4,300 digits in an enum)
            checks.append((False, f"{name}: {e}"))
        except RecursionError:
            checks.append((False, f"{name}: nested too deeply"))
    return checks


def _as_list(value: Any, name: str) -> list[Any]:
    """A list field given as None (empty), one string or any iterable, as a list; anything else
    (stop=5) is refused naming the field, where list() would raise a bare TypeError."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable):
        raise InvalidParameterError(f"{name} must be a list, got {value!r}")
    return list(value)


def _is_token_id(token: object) -> bool:
    return isinstance(token, numbers.Integral) and not isinstance(token, bool) and token >= 0


def _thinking_markers(markers: Any) -> bool:
    if not isinstance(markers, tuple) or len(markers) != 2:
        return False
    opener, closer = markers
    return isinstance(closer, str) and bool(closer) and (opener is None or (
        isinstance(opener, str) and bool(opener)))

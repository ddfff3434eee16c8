"""Speculative decoding with n-gram drafts (vLLM's `speculative_config={"method": "ngram"}`).

After each step, a decoding request whose last tokens appeared earlier in its prompt or output
is given the tokens that followed them there as drafts. The next step feeds the request's new
token and its drafts together, so one forward pass scores every draft position (at one sequence
the step reads the weights once, as a plain decode step does).

The verification is lossless, greedy or not. At each draft position the runner samples a token
from the target distribution exactly as a plain step would (penalties, top-k/p, min-p,
temperature); the drafts are accepted while they equal those tokens, and the first token that
differs (or the one after the last draft) ends the step's output. For a draft that is one token
with certainty (an n-gram's), this is the rejection sampling of Leviathan et al.: a draft d is
kept with probability p(d), and otherwise the token comes from p without d, renormalized.
"""

from __future__ import annotations

import itertools
import json
from array import array
from dataclasses import dataclass, field

from inferlab.errors import InferlabError

_INT = array("i").itemsize


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config for the n-gram method; unset lookup bounds take each other's
    value, both 5 when neither is given (vLLM's defaults).

    Verifying drafts stops paying once a step's rows make it compute-bound (on this project's
    2-core CPU, from about 4 streams), hence vLLM's two ways to draft less as more requests run:
    disable_by_batch_size, no drafts while more requests than it run; and
    num_speculative_tokens_per_batch_size, [[first, last, k], ...]: k drafts at most while
    first..last requests run (num_speculative_tokens outside every range)."""

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    disable_by_batch_size: int | None = None
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise InferlabError(f"speculative method {self.method!r} is not supported here "
                                "(only 'ngram': this engine loads no draft model)")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InferlabError(f"num_speculative_tokens must be a positive integer, got {k!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        # one given sets both; neither: vLLM's 5 (a 0 is refused below, not read as unset)
        low = (5 if high is None else high) if low is None else low
        high = low if high is None else high
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InferlabError(f"{name} must be a positive integer, got {value!r}")
        if low > high:
            raise InferlabError(f"prompt_lookup_min ({low}) is over prompt_lookup_max ({high})")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)
        limit = self.disable_by_batch_size
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
            raise InferlabError(f"disable_by_batch_size must be an integer of at least 2, got {limit!r}")
        if self.num_speculative_tokens_per_batch_size is not None:
            object.__setattr__(self, "num_speculative_tokens_per_batch_size",
                               _batch_size_table(self.num_speculative_tokens_per_batch_size, k))

    def drafts_for(self, batch_size: int) -> int:
        """How many drafts a request may get while batch_size requests run."""
        if self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size:
            return 0
        for first, last, k in self.num_speculative_tokens_per_batch_size or ():
            if first <= batch_size <= last:
                return k
        return self.num_speculative_tokens

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """--speculative-config's JSON object, e.g. '{"method": "ngram", "num_speculative_tokens": 4}'."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise InferlabError(f"speculative config is not JSON: {e}") from None
        if not isinstance(fields, dict):
            raise InferlabError("speculative config must be a JSON object")
        return cls.from_dict(fields)

    @classmethod
    def from_dict(cls, fields: dict) -> SpeculativeConfig:
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                 "disable_by_batch_size", "num_speculative_tokens_per_batch_size"}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InferlabError(f"speculative config: unknown field(s) {', '.join(unknown)} "
                                f"(known: {', '.join(sorted(known))})")
        if "num_speculative_tokens" not in fields:
            raise InferlabError("speculative config needs num_speculative_tokens")
        return cls(**fields)


def _batch_size_table(entries: object, max_k: int) -> tuple[tuple[int, int, int], ...]:
    """[[first, last, k], ...] checked: integers, 1 <= first <= last, 0 <= k <= max_k, ranges
    apart."""
    def is_int(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not isinstance(entries, (list, tuple)):
        raise InferlabError("num_speculative_tokens_per_batch_size must be a list of [first, last, k]")
    table = []
    for entry in entries:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and all(map(is_int, entry))):
            raise InferlabError(f"num_speculative_tokens_per_batch_size: {entry!r} is not [first, last, k]")
        first, last, k = entry
        if not 1 <= first <= last or not 0 <= k <= max_k:
            raise InferlabError(f"num_speculative_tokens_per_batch_size: {list(entry)} needs "
                                f"1 <= first <= last and 0 <= k <= num_speculative_tokens ({max_k})")
        table.append((first, last, k))
    table.sort()
    for (_, last, _), (first, _, _) in itertools.pairwise(table):
        if first <= last:
            raise InferlabError("num_speculative_tokens_per_batch_size: its ranges overlap")
    return tuple(table)


def propose_ngram(token_ids: list[int], config: SpeculativeConfig, max_drafts: int) -> list[int]:
    """Up to max_drafts tokens that followed the earliest occurrence of the sequence's last n
    tokens, trying n from prompt_lookup_max down to prompt_lookup_min; [] when none occurred.
    The earliest, as vLLM picks it: in a periodic stretch the latest occurrence sits one period
    back, so its followers run into the sequence's end after a period's worth of drafts.

    The search runs on the tokens' bytes (bytes.find, in C), so a step costs no Python loop
    over the context; a hit at a byte offset inside a token is skipped.
    """
    num_tokens = len(token_ids)
    if max_drafts < 1 or num_tokens < config.prompt_lookup_min + 1:
        return []
    data = array("i", token_ids).tobytes()
    end = (num_tokens - 1) * _INT  # an occurrence must leave a token after it
    for n in range(min(config.prompt_lookup_max, num_tokens - 1), config.prompt_lookup_min - 1, -1):
        pattern, begin = data[(num_tokens - n) * _INT:], 0
        while (at := data.find(pattern, begin, end)) >= 0:
            if at % _INT == 0:
                start = at // _INT + n
                return token_ids[start:start + max_drafts]
            begin = at + 1  # misaligned: look further on
    return []


def accepted_tokens(drafts: list[int], sampled: list[int]) -> list[int]:
    """The tokens a step outputs: sampled[j] was drawn at draft position j (after drafts[:j]),
    len(sampled) == len(drafts) + 1. Drafts are kept while they equal what was sampled at their
    position; the first sampled token that differs, or the one after every draft, ends it."""
    out = []
    for draft, token in zip(drafts, sampled, strict=False):
        out.append(token)
        if token != draft:
            return out
    out.append(sampled[len(drafts)])
    return out


@dataclass
class SpecDecodeCounters:
    """Totals since start, as vLLM exports them (vllm:spec_decode_*)."""

    num_drafts: int = 0  # steps in which a request had drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [j]: drafts kept at j

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's step: how many drafts it verified, how many it kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        missing = num_draft_tokens - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position += [0] * missing
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

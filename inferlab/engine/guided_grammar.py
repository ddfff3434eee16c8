"""Guided decoding by a grammar: OpenAI's json_object and json_schema response formats (the
output is one JSON value the schema takes, json_grammar.py), vLLM's guided_regex (the output
matches the pattern, regex_grammar.py) and guided_grammar (a whole root of an EBNF grammar,
ebnf_grammar.py), then EOS.

At each step a request may sample only the tokens whose text keeps its output a prefix of an
allowed one, and EOS once it is whole. Which tokens those are depends only on the grammar
state, so `TokenFilter` computes each state's set once and keeps it: a generation meets a few
dozen states, most of them again and again. Computing a set reads only the tokens that can
start there (by their first character, or the first after their leading whitespace where every
whitespace acts alike) and, where the grammar says any plain text goes on (inside a JSON
string, or one held to a length alone), only the tokens that hold a quote, a backslash or a
control character: the others are kept by their length.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from inferlab.engine.ebnf_grammar import EbnfGrammar
from inferlab.engine.grammar import Grammar
from inferlab.engine.json_grammar import WHITESPACE, JsonGrammar
from inferlab.engine.json_schema import canonical_text
from inferlab.engine.regex_grammar import RegexGrammar
from inferlab.models.tokenizer import TextTokenizer

_SURROGATES = re.compile("[\ud800-\udfff]")


def token_texts(tokenizer: TextTokenizer) -> list[str | None]:
    """The text each token adds to an output, None for special and empty tokens.

    A token is decoded after an anchor token and the anchor's text cut off, so tokenizers that
    drop a word's leading space when it starts the text (SentencePiece) keep it here.
    """
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1]
    anchor_text = tokenizer.decode([anchor], skip_special_tokens=False)
    size = tokenizer.vocab_size
    pairs = tokenizer.backend.decode_batch([[anchor, i] for i in range(size)], skip_special_tokens=False)
    texts: list[str | None] = []
    for token_id, text in enumerate(pairs):
        if token_id in tokenizer.all_special_ids:
            texts.append(None)
            continue
        if text.startswith(anchor_text):
            text = text[len(anchor_text):]
        else:
            text = tokenizer.decode([token_id], skip_special_tokens=False)
        texts.append(text or None)
    return texts


class TokenIndex:
    """A vocabulary's token texts indexed by how they begin; built once, shared by every grammar."""

    def __init__(self, texts: list[str | None], vocab_size: int) -> None:
        # one entry a row of the logits: a model may have more rows than its tokenizer has
        # tokens (never sampled here), or fewer (the extra tokens cannot be sampled)
        self.texts = (texts + [None] * vocab_size)[:vocab_size]
        self.by_first_char: dict[str, list[int]] = {}  # tokens that do not start with whitespace
        # Where every whitespace character acts alike, and after one the state stays put (between
        # a JSON container's tokens), tokens that start with whitespace go by the first
        # character after it (most tokens of a byte-level vocabulary begin with a space)
        self.after_space: dict[str, list[int]] = {}
        self.spaces: list[int] = []  # tokens of whitespace only
        self.by_space: dict[str, list[int]] = {}  # tokens that start with whitespace, by its first
        # tokens that continue any string as they are, shortest first, and their lengths
        self.string_safe: list[int] = []
        self.string_safe_lengths: list[int] = []
        self.string_unsafe: list[int] = []
        for token_id, text in enumerate(self.texts):
            if text is None:
                continue
            rest = text.lstrip("".join(WHITESPACE))
            if rest == text:
                self.by_first_char.setdefault(text[0], []).append(token_id)
            else:
                self.by_space.setdefault(text[0], []).append(token_id)
                if rest:
                    self.after_space.setdefault(rest[0], []).append(token_id)
                else:
                    self.spaces.append(token_id)
            if '"' in text or "\\" in text or min(text) < " " or _SURROGATES.search(text):
                self.string_unsafe.append(token_id)
            else:
                self.string_safe.append(token_id)
        self.string_safe.sort(key=lambda i: len(self.texts[i]))
        self.string_safe_lengths = [len(self.texts[i]) for i in self.string_safe]


class TokenFilter:
    """For a grammar state, the tokens that may follow: a cached bool mask over the vocabulary
    (49 KB for 49k tokens; a mask costs the sampler a copy, where ids cost it a scatter). EOS is
    in it once the value is whole."""

    def __init__(self, grammar: Grammar, index: TokenIndex, eos_token_id: int,
                 max_states: int = 512) -> None:
        self.grammar = grammar
        self.index = index
        self.eos_token_id = eos_token_id
        self.max_states = max_states
        self._cache: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def allowed(self, state: Hashable) -> torch.Tensor:
        """bool [V]: the tokens whose whole text the grammar takes from `state`."""
        mask = self._cache.get(state)
        if mask is None:
            mask = torch.zeros(len(self.index.texts), dtype=torch.bool)
            mask[self._compute(state)] = True
            self._cache[state] = mask
            if len(self._cache) > self.max_states:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(state)
        return mask

    def _compute(self, state: Hashable) -> list[int]:
        grammar, index = self.grammar, self.index
        room = grammar.plain_text_room(state)
        if room is not None:
            candidates = index.string_unsafe
            keep = index.string_safe[:bisect.bisect_right(index.string_safe_lengths, room)]
        else:
            candidates, keep = self._starting(index.by_first_char, state), []
            spaced = self._after_any_space(state)
            if spaced is not None:
                keep = list(index.spaces)
                candidates += self._starting(index.after_space, spaced)
            else:
                candidates += self._starting(index.by_space, state)
        allowed = keep + [i for i in candidates if grammar.advance(state, index.texts[i]) is not None]
        return allowed + [self.eos_token_id] if grammar.is_complete(state) else allowed

    def _after_any_space(self, state: Hashable) -> Hashable | None:
        """The state after any run of whitespace, where every whitespace character leads to it
        and keeps it (between a JSON container's tokens); None elsewhere."""
        spaced = self.grammar.step(state, " ")
        if spaced is None or any(self.grammar.step(s, w) != spaced
                                 for s in (state, spaced) for w in WHITESPACE):
            return None
        return spaced

    def _starting(self, by_char: dict[str, list[int]], state: Hashable) -> list[int]:
        """The indexed tokens whose indexed character the grammar takes from `state`."""
        return [i for ch, ids in by_char.items() if self.grammar.step(state, ch) is not None
                for i in ids]


class GrammarGuide:
    """One request's place in the grammar, advanced by the tokens it has sampled since."""

    def __init__(self, token_filter: TokenFilter) -> None:
        self.filter = token_filter
        self.state: Hashable | None = token_filter.grammar.start
        self.consumed = 0  # output tokens already read into self.state

    def allowed_now(self, output: list[int]) -> torch.Tensor | list[int]:
        texts = self.filter.index.texts
        for token_id in output[self.consumed:]:
            self.state = self.filter.grammar.advance(self.state, texts[token_id] or "")
        self.consumed = len(output)
        if self.state is None:
            return [self.filter.eos_token_id]
        mask = self.filter.allowed(self.state)
        return mask if mask.any() else [self.filter.eos_token_id]  # a vocabulary that cannot go on


GRAMMARS: dict[str, Callable[[Any], Grammar]] = {"json": JsonGrammar, "regex": RegexGrammar, "ebnf": EbnfGrammar}


class GrammarFilters:
    """An engine's token filters, one for each grammar in use (the last `max_grammars`, so their
    masks stay under ~200 MB for a 49k vocabulary), over one token index built when the first
    is needed (it decodes every token once, ~0.2 s)."""

    def __init__(self, build_index: Callable[[], TokenIndex], eos_token_id: int,
                 max_grammars: int = 8) -> None:
        self.build_index = build_index
        self.eos_token_id = eos_token_id
        self.max_grammars = max_grammars
        self._filters: OrderedDict[tuple[str, str], TokenFilter] = OrderedDict()

    @functools.cached_property
    def index(self) -> TokenIndex:
        return self.build_index()

    def guide(self, kind: str, spec: Any) -> GrammarGuide:
        """A new guide for one request (each of n copies has its own place in the grammar):
        kind "json" with a schema, "regex" with a pattern, "ebnf" with a grammar's text."""
        key = (kind, canonical_text(spec) if kind == "json" else spec)
        token_filter = self._filters.get(key)
        if token_filter is None:
            token_filter = TokenFilter(GRAMMARS[kind](spec), self.index, self.eos_token_id)
            self._filters[key] = token_filter
            if len(self._filters) > self.max_grammars:
                self._filters.popitem(last=False)
        else:
            self._filters.move_to_end(key)
        return GrammarGuide(token_filter)

"""Guided decoding's token filter: at each step a request may sample only the tokens whose text
keeps its output a prefix of one its grammar allows, and EOS once it is whole.

Which tokens those are depends only on the grammar state, so `TokenFilter` computes each
state's set once and keeps it: a generation meets a few dozen states, most of them again and
again. Computing a set walks all tokens together, one character position at a time
(`TokenFilter._taken`), so the grammar steps once for each state and character (or class of
characters it tells apart) the vocabulary reaches, not once for each token's each character.
Where the grammar says any plain text goes on (inside a JSON string, or one held to a length
alone), only the tokens that hold a quote, a backslash or a control character are walked: the
others are kept by their length (token_index.py). Tokens that hold part of a character's bytes
are read by their bytes, a character begun carried beside the grammar's state
(engine/utf8_tokens.py).
"""

from __future__ import annotations

import bisect
import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.grammar import Grammar, too_ambiguous
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import canonical_text
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.structural_tag import StructuralTagGrammar
from inferlab.engine.guided.thinking_grammar import AfterThinking
from inferlab.engine.guided.token_index import TokenIndex
from inferlab.errors import GuidedDecodingError

FEW_TOKENS = 512  # a state's tokens up to this many are read one by one: cheaper than splitting them


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
        self._cut = False  # a mask under way left out tokens past MAX_READINGS

    def allowed(self, state: Hashable, pending: bytes = b"") -> torch.Tensor:
        """bool [V]: the tokens whose whole text the grammar takes from `state`, after `pending`,
        the bytes of a character begun (then only byte tokens may follow)."""
        key = (state, pending)
        mask = self._cache.get(key)
        if mask is None:
            mask = torch.zeros(len(self.index.texts), dtype=torch.bool)
            self._cut = False
            if pending:
                mask[[i for i, raw in self.index.spelling.items()
                      if self._walk(self.grammar.advance_bytes, state, pending, raw) is not None]] = True
            else:
                mask[[i for i, text, tail in self.index.byte_starts
                      if self._walk(self.grammar.advance_split, state, text, tail) is not None]] = True
                mask[self._compute(state)] = True
                if self.grammar.is_complete(state):
                    mask[self.eos_token_id] = True
            if self._cut and not mask.any():  # every way on is too ambiguous to follow
                raise too_ambiguous()
            self._cache[key] = mask
            if len(self._cache) > self.max_states:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return mask

    def _compute(self, state: Hashable) -> torch.Tensor:
        """The ids of the tokens the grammar takes from `state`."""
        index = self.index
        moving = self.grammar.moving_chars(state)
        if moving is not None:  # free text: only the tokens that may leave the state are read
            staying, leaving = index.partition(moving)
            return torch.cat([staying, self._taken(state, index.split(leaving, 0))])
        room = self.grammar.plain_text_room(state)
        if room is None:
            return self._taken(state, index.all_tokens)
        # plain text goes on by its length alone: only the other tokens are read
        keep = index.string_safe[:bisect.bisect_right(index.string_safe_lengths, room)]
        return torch.cat([keep, self._taken(state, index.string_unsafe)])

    def _taken(self, state: Hashable, candidates: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
        """The candidates (split by their first character) whose whole text the grammar takes
        from `state`, walked together one character position at a time: at each, the tokens
        that reached the same state are split by their next character, and the grammar steps
        once for each set of characters it tells apart (char_key), not once a token."""
        index = self.index
        taken: list[torch.Tensor] = []
        read: list[int] = []  # tokens read one by one: a few left in a state, or past index.depth
        groups = self._moves(state, candidates)
        for depth in range(1, index.depth + 1):
            after: dict[Hashable, list[torch.Tensor]] = {}
            for at, members in groups.items():
                members = torch.cat(members)
                if depth == index.depth or members.numel() <= FEW_TOKENS:
                    read += [i for i in members.tolist()
                             if self._walk(self.grammar.advance, at, index.texts[i][depth:]) is not None]
                    continue
                ended = index.lengths[members] == depth
                taken.append(members[ended])
                if not bool(ended.all()):
                    for nxt, parts in self._moves(at, index.split(members[~ended], depth)).items():
                        after.setdefault(nxt, []).extend(parts)
            groups = after
        return torch.cat([*taken, torch.tensor(read, dtype=torch.int64)])

    def _moves(self, state: Hashable, parts: list[tuple[str, torch.Tensor]]) -> dict[Hashable, list[torch.Tensor]]:
        """Each part (tokens whose next character is `ch`) by the state `ch` leads to; dead
        parts dropped. Characters the grammar's char_key tells alike are stepped once."""
        key, steps = self.grammar.char_key(state), {}
        moves: dict[Hashable, list[torch.Tensor]] = {}
        for ch, part in parts:
            k = ch if key is None else key(ch)
            if k not in steps:
                steps[k] = self._walk(self.grammar.step, state, ch)
            if steps[k] is not None:
                moves.setdefault(steps[k], []).append(part)
        return moves

    def _walk(self, move: Callable[..., Any], *args: Any) -> Any:
        """move(*args), a grammar's step or advance, or None where the text would read in more
        than MAX_READINGS ways: the filter offers no token that leads there."""
        try:
            return move(*args)
        except GuidedDecodingError:
            self._cut = True
            return None


class GrammarGuide:
    """One request's place in the grammar, advanced by the tokens it has sampled since."""

    def __init__(self, token_filter: TokenFilter) -> None:
        self.filter = token_filter
        self.state: Hashable | None = token_filter.grammar.start
        self.pending = b""  # the bytes of a character begun and not yet ended
        self.consumed = 0  # output tokens already read into self.state

    def allowed_now(self, output: list[int], drafts: Sequence[int] = ()) -> torch.Tensor | list[int]:
        """What may follow the output, and the drafts as if kept: the guide moves over the
        output only (drafts may be rejected)."""
        self.state, self.pending = self._advance(self.state, self.pending, output[self.consumed:])
        self.consumed = len(output)
        try:
            state, pending = self._advance(self.state, self.pending, drafts)
        except GuidedDecodingError:  # drafts the filter would not have offered: rejected
            state, pending = None, b""
        if state is None:
            return [self.filter.eos_token_id]
        mask = self.filter.allowed(state, pending)  # raises where no way on is left
        if not mask.any():  # the grammar wants a character no token spells (a lone surrogate)
            raise GuidedDecodingError("no token of the vocabulary spells what the grammar takes next")
        return mask

    def _advance(self, state: Hashable | None, pending: bytes,
                 token_ids: Sequence[int]) -> tuple[Hashable | None, bytes]:
        grammar, index = self.filter.grammar, self.filter.index
        for token_id in token_ids:
            if state is None:
                break
            raw = index.spelling.get(token_id)
            if raw is not None:
                state, pending = grammar.advance_bytes(state, pending, raw) or (None, b"")
            elif pending:  # a whole character where the last one has not ended
                state = None
            else:
                state = grammar.advance(state, index.texts[token_id] or "")
        return state, pending


GRAMMARS: dict[str, Callable[[Any], Grammar]] = {
    "json": JsonGrammar, "compact_json": functools.partial(JsonGrammar, whitespace=False),
    "regex": RegexGrammar, "ebnf": EbnfGrammar, "structural_tag": StructuralTagGrammar}


class GrammarFilters:
    """An engine's token filters, one for each grammar in use (the last `max_grammars`, so their
    masks stay under ~200 MB for a 49k vocabulary), over one token index built when the first
    is needed (it decodes every token once, ~0.2 s)."""

    def __init__(self, build_index: Callable[[], TokenIndex], eos_token_id: int,
                 max_grammars: int = 8) -> None:
        self.build_index = build_index
        self.eos_token_id = eos_token_id
        self.max_grammars = max_grammars
        self._filters: OrderedDict[tuple[Any, ...], TokenFilter] = OrderedDict()

    @functools.cached_property
    def index(self) -> TokenIndex:
        return self.build_index()

    def guide(self, kind: str, spec: Any,
              after: tuple[str | None, str] | None = None) -> GrammarGuide:
        """A new guide for one request (each of n copies has its own place in the grammar):
        kind "json" or "compact_json" (no whitespace) with a schema, "regex" with a pattern,
        "ebnf" with a grammar's text, "structural_tag" with a tag's spec; after:
        a reasoning model's (opener, closer) of its thinking, which the grammar starts after."""
        key = (kind, spec if isinstance(spec, str) else canonical_text(spec), after)
        token_filter = self._filters.get(key)
        if token_filter is None:
            grammar = GRAMMARS[kind](spec)
            if after is not None:
                grammar = AfterThinking(grammar, closer=after[1], opener=after[0])
            token_filter = TokenFilter(grammar, self.index, self.eos_token_id)
            self._filters[key] = token_filter
            if len(self._filters) > self.max_grammars:
                self._filters.popitem(last=False)
        else:
            self._filters.move_to_end(key)
        return GrammarGuide(token_filter)

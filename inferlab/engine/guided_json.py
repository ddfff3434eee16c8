"""OpenAI's json_object response format: the output is one JSON object, then EOS.

At each step a request may sample only the tokens whose text keeps its output a prefix of some
JSON object (json_grammar.py), and EOS once the object is closed. Which tokens those are depends
only on the grammar state, so `JsonTokenFilter` computes each state's set once and keeps it:
a generation meets a few dozen states, most of them again and again. Computing a set reads only
the tokens that can start there (by their first character, or the first after their leading
whitespace) and, inside a string, only the tokens that hold a quote, a backslash or a control
character: any other token just continues the string.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from inferlab.engine.json_grammar import START, WHITESPACE, State, advance, is_complete, step
from inferlab.models.tokenizer import TextTokenizer

_STRING_MODES = ("str", "key")  # inside a string, after no backslash


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


class JsonTokenFilter:
    """For a grammar state, the tokens that may follow: a cached bool mask over the vocabulary
    (49 KB for 49k tokens; a mask costs the sampler a copy, where ids cost it a scatter)."""

    def __init__(self, texts: list[str | None], vocab_size: int, max_states: int = 1024) -> None:
        # one entry a row of the logits: a model may have more rows than its tokenizer has
        # tokens (never sampled here), or fewer (the extra tokens cannot be sampled)
        self.texts = (texts + [None] * vocab_size)[:vocab_size]
        self.by_first_char: dict[str, list[int]] = {}  # tokens that do not start with whitespace
        # Outside strings every whitespace character acts alike, and after one the state stays
        # put: tokens that start with whitespace go by the first character after it (most
        # tokens of a byte-level vocabulary begin with a space)
        self.after_space: dict[str, list[int]] = {}
        self.spaces: list[int] = []  # tokens of whitespace only
        self.string_safe: list[int] = []  # tokens that continue any string as they are
        self.string_unsafe: list[int] = []
        for token_id, text in enumerate(self.texts):
            if text is None:
                continue
            rest = text.lstrip("".join(WHITESPACE))
            if rest == text:
                self.by_first_char.setdefault(text[0], []).append(token_id)
            elif rest:
                self.after_space.setdefault(rest[0], []).append(token_id)
            else:
                self.spaces.append(token_id)
            if '"' in text or "\\" in text or min(text) < " ":
                self.string_unsafe.append(token_id)
            else:
                self.string_safe.append(token_id)
        self.max_states = max_states
        self._cache: OrderedDict[State, torch.Tensor] = OrderedDict()

    def allowed(self, state: State) -> torch.Tensor:
        """bool [V]: the tokens whose whole text the grammar takes from `state`."""
        mask = self._cache.get(state)
        if mask is None:
            mask = torch.zeros(len(self.texts), dtype=torch.bool)
            mask[self._compute(state)] = True
            self._cache[state] = mask
            if len(self._cache) > self.max_states:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(state)
        return mask

    def _compute(self, state: State) -> list[int]:
        if state[0] in _STRING_MODES:
            candidates, keep = self.string_unsafe, list(self.string_safe)
        else:
            candidates, keep = self._starting(self.by_first_char, state), []
            spaced = step(state, " ")
            if spaced is not None:
                keep = list(self.spaces)
                candidates += self._starting(self.after_space, spaced)
        return keep + [i for i in candidates if advance(state, self.texts[i]) is not None]

    @staticmethod
    def _starting(index: dict[str, list[int]], state: State) -> list[int]:
        """The indexed tokens whose indexed character the grammar takes from `state`."""
        return [i for ch, ids in index.items() if step(state, ch) is not None for i in ids]


class JsonGuide:
    """One request's place in the grammar, advanced by the tokens it has sampled since."""

    def __init__(self, token_filter: JsonTokenFilter, eos_token_id: int) -> None:
        self.filter = token_filter
        self.eos_token_id = eos_token_id
        self.state: State | None = START
        self.consumed = 0  # output tokens already read into self.state

    def allowed_now(self, output: list[int]) -> torch.Tensor | list[int]:
        for token_id in output[self.consumed:]:
            self.state = advance(self.state, self.filter.texts[token_id] or "")
        self.consumed = len(output)
        if self.state is None or is_complete(self.state):
            return [self.eos_token_id]
        mask = self.filter.allowed(self.state)
        return mask if mask.any() else [self.eos_token_id]  # a vocabulary that cannot go on: stop

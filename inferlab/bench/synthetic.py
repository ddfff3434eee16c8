"""Synthetic prompts cut from real text, to the token lengths a `SyntheticSpec` asks.

Real text, not random tokens: a server's speed can depend on what it reads (speculative
decoding, tokenizer paths). Every prompt starts at a different place in the text, and
the benchmark puts a unique tag right after the shared prefix, so no two requests share
a prefix-cache block beyond the prefix they are meant to share.
"""

from __future__ import annotations

import random
from pathlib import Path

from inferlab.bench.datasets import Prompt
from inferlab.bench.dataspec import SyntheticSpec
from inferlab.bench.tags import REFERENCE_TAG, SAMPLE_TAGS
from inferlab.bench.tokens import TAG_TOKENS_ESTIMATE, TokenCounter, words_for_tokens
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text

FIT_STARTS = 16  # places in the text tried before an exact length is declared unreachable
FIT_STEPS = 4  # length corrections tried at each place


class TextSource:
    """The corpus as words, and as token ids when a tokenizer is given."""

    def __init__(self, path: Path, counter: TokenCounter) -> None:
        text = read_user_text(path, "data file")
        self.words = text.split()
        if len(self.words) < 100:
            raise InferlabError(f"{path} has too little text to cut prompts from")
        self.path = path
        self.counter = counter
        self.head_tokens: dict[str, int] = {}  # see fit()
        # token ids of the whole text, so a prompt is an exact slice of it
        self.ids = counter.encode(" ".join(self.words)) if counter.exact else None

    def cut(self, tokens: int, rng: random.Random) -> str:
        """About `tokens` tokens of consecutive text from a random place (by the word rule)."""
        if tokens <= 0:
            return ""
        count = words_for_tokens(tokens)
        start = rng.randrange(max(1, len(self.words) - count))
        words = self.words[start:start + count]
        while len(words) < count:
            words += self.words[:count - len(words)]
        return " ".join(words)

    def fit(self, tokens: int, rng: random.Random, head: str = "") -> str:
        """Consecutive text from a random place such that `head + text` is exactly `tokens`
        tokens long. A slice of token ids decodes to text that can re-encode a token or two
        off at its edges, so the slice's length is corrected until the count is right."""
        assert self.ids is not None, "exact lengths need a tokenizer"
        for _ in range(FIT_STARTS):
            start = rng.randrange(max(1, len(self.ids) - tokens))  # wraps only when it must
            # what `head` adds, as the last fit with it found: most prompts fit at once
            length = max(1, tokens - self.head_tokens.get(head, self.counter.count(head)))
            for _ in range(FIT_STEPS):
                text = self._slice(start, length)
                got = self.counter.count(head + text)
                self.head_tokens[head] = got - length
                if got == tokens:
                    return text
                length += tokens - got
                if length < 1:
                    break
        raise InferlabError(f"cannot cut a prompt of exactly {tokens} tokens from {self.path}")

    def _slice(self, start: int, length: int) -> str:
        assert self.ids is not None
        window = self.ids[start:start + length]
        while len(window) < length:  # a prompt longer than the text: wrap around
            window += self.ids[:length - len(window)]
        return self.counter.decode(window).strip()


def tag_tokens(counter: TokenCounter) -> int | None:
    """What the unique tag costs with this tokenizer, or None when that depends on its digits
    (a vocabulary that merges digits unevenly): then prompt lengths cannot be exact."""
    costs = {counter.count(tag.strip()) for tag in SAMPLE_TAGS}
    return costs.pop() if len(costs) == 1 else None


def synthetic_prompts(spec: SyntheticSpec, source: TextSource, count: int, chat: bool,
                      seed: int) -> list[Prompt]:
    """`count` prompts; the tag (added later) goes between the shared prefix and the rest.

    With a tokenizer, each prompt with a tag is exactly `prefix_tokens + prompt_tokens`
    long; without one, about that long by the word rule.
    """
    rng = random.Random(seed)
    exact = source.ids is not None
    prefix = ""
    if spec.prefix_tokens:
        prefix = (source.fit(spec.prefix_tokens, rng) if exact
                  else source.cut(spec.prefix_tokens, rng)) + " "
    prompts = []
    for _ in range(count):
        prompt_tokens = spec.prompt.sample(rng)
        if exact:  # the tag is counted in: the request has exactly these tokens
            tokens = spec.prefix_tokens + prompt_tokens
            text = prefix + _exact_body(source, prefix, tokens, rng)
        else:
            text = prefix + source.cut(max(1, prompt_tokens - TAG_TOKENS_ESTIMATE), rng)
            tokens = source.counter.count_tagged(text, len(prefix))
        output = spec.output.sample(rng)
        # the output length is a count: sent with ignore_eos unless --no-ignore-eos
        if chat:
            message = {"role": "user", "content": text}
            prompts.append(Prompt(None, (message,), tokens, output, tag_at=len(prefix),
                                  exact_output=True))
        else:
            prompts.append(Prompt(text, None, tokens, output, tag_at=len(prefix),
                                  exact_output=True))
    return prompts


def _exact_body(source: TextSource, prefix: str, total_tokens: int, rng: random.Random) -> str:
    """The text after the tag that makes prefix + tag + text `total_tokens` long."""
    least = source.counter.count(prefix + REFERENCE_TAG.strip()) + 1
    if total_tokens < least:
        raise InferlabError(f"--data: a prompt of {total_tokens} tokens cannot hold the unique "
                            f"tag and text with this --tokenizer; it needs at least {least} "
                            "(raise prompt_tokens, and prompt_tokens_min)")
    return source.fit(total_tokens, rng, head=prefix + REFERENCE_TAG)

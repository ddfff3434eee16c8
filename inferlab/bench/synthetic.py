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
from inferlab.bench.tokens import TokenCounter, words_for_tokens
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text

TAG_TOKENS_RESERVED = 8  # what a tag like "[a1b2c3-123456] " costs in common vocabularies


class TextSource:
    """The corpus as words, and as token ids when a tokenizer is given."""

    def __init__(self, path: Path, counter: TokenCounter) -> None:
        text = read_user_text(path, "data file")
        self.words = text.split()
        if len(self.words) < 100:
            raise InferlabError(f"{path} has too little text to cut prompts from")
        self.counter = counter
        # token ids of the whole text, so a prompt is an exact slice of it
        self.ids = counter.encode(" ".join(self.words)) if counter.exact else None

    def cut(self, tokens: int, rng: random.Random) -> str:
        """About `tokens` tokens of consecutive text from a random place (exact with ids)."""
        if tokens <= 0:
            return ""
        if self.ids is not None:
            start = rng.randrange(max(1, len(self.ids) - tokens))
            window = self.ids[start:start + tokens]
            while len(window) < tokens:  # a prompt longer than the text: wrap around
                window += self.ids[:tokens - len(window)]
            return self.counter.decode(window).strip()
        count = words_for_tokens(tokens)
        start = rng.randrange(max(1, len(self.words) - count))
        words = self.words[start:start + count]
        while len(words) < count:
            words += self.words[:count - len(words)]
        return " ".join(words)


def synthetic_prompts(spec: SyntheticSpec, source: TextSource, count: int, chat: bool,
                      seed: int) -> list[Prompt]:
    """`count` prompts; the tag (added later) goes between the shared prefix and the rest."""
    rng = random.Random(seed)
    prefix = source.cut(spec.prefix_tokens, rng)
    prefix = prefix + " " if prefix else ""
    prompts = []
    for _ in range(count):
        prompt_tokens = spec.prompt.sample(rng)
        body = source.cut(max(1, prompt_tokens - TAG_TOKENS_RESERVED), rng)
        text = prefix + body
        tokens = source.counter.count(text) + TAG_TOKENS_RESERVED
        output = spec.output.sample(rng)
        if chat:
            message = {"role": "user", "content": text}
            prompts.append(Prompt(None, (message,), tokens, output, tag_at=len(prefix)))
        else:
            prompts.append(Prompt(text, None, tokens, output, tag_at=len(prefix)))
    return prompts

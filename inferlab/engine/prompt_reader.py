"""Prompts as a request runs them: a text or token ids checked against the model (vocabulary,
context), encoded, and cut to their last tokens where truncate_prompt_tokens asks, as vLLM
cuts them."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from inferlab.errors import ContextLengthError, InvalidParameterError, PromptError
from inferlab.models.tokenizer import TextTokenizer


class PromptReader:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's rows, which a tokenizer may know fewer of
        self.max_model_len = max_model_len

    def tokenize(self, prompt: str | Sequence[int], truncating: bool = False,
                 add_special_tokens: bool = True) -> tuple[str | None, list[int]]:
        """(text or None, token ids); truncating: the request keeps only the prompt's last
        tokens (truncate_prompt_tokens), so its length cannot be refused before encoding."""
        if isinstance(prompt, str):
            if not truncating:
                self.check_text_fits(len(prompt))
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        elif not isinstance(prompt, Sequence) or isinstance(prompt, bytes | bytearray):
            raise PromptError(f"a prompt must be a text or a list of token ids, got "
                              f"{type(prompt).__name__}")  # a dict's keys once ran as token ids
        else:
            text, ids = None, [int(t) for t in prompt]
            if any(t != i for t, i in zip(prompt, ids, strict=True)):  # 1.5 or "7", not truncated
                raise PromptError("token ids must be integers")
        # a tokenizer may know more tokens than the model has rows for
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise PromptError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        return text, ids

    def check_text_fits(self, num_chars: int) -> None:
        """Refuse, without encoding it, a text too long for the context whatever its tokens:
        a 8 MB prompt takes 5 s of a core to encode. A token spells at most max_token_chars
        characters; normalization (NFKC) contracts text by far less than the slack of 4."""
        if not self.tokenizer.keeps_every_character:  # 25,000 spaces may be no token at all
            return
        at_least = num_chars // (4 * self.tokenizer.max_token_chars)
        if at_least > self.max_model_len:
            raise ContextLengthError(f"the prompt ({num_chars} characters) has at least {at_least} "
                                f"tokens, over the context length {self.max_model_len}")

    def read(self, prompt: str | Sequence[int], prompt_text: str | None,
             keep: int | None) -> tuple[str | None, list[int]]:
        """(text or None, token ids) a request runs: its last `keep` only (truncate_prompt_tokens)."""
        keep = self.max_model_len if keep == -1 else keep
        if keep is not None and keep > self.max_model_len:  # as vLLM refuses it
            raise InvalidParameterError(f"truncate_prompt_tokens ({keep}) is over the context "
                                        f"length {self.max_model_len}: choose a smaller one")
        text, ids = self.tokenize(prompt, keep is not None)
        text = text if text is not None else prompt_text
        if keep is not None and len(ids) > keep:  # vLLM's left truncation; the text no longer fits
            text, ids = None, self._truncate_text(ids, keep) if text is not None else ids[-keep:]
        if not ids:
            raise PromptError("the prompt is empty")
        return text, ids

    def _truncate_text(self, ids: list[int], keep: int) -> list[int]:
        """A text's `keep` last tokens as vLLM has transformers cut them: added ones (BOS) stay."""
        head, tail = self._added_tokens
        end = len(ids) - len(tail)
        if ids[:len(head)] != head or ids[end:] != tail:
            return ids[-keep:]  # encoded without them
        room = keep - len(head) - len(tail)
        if room < 0:
            raise InvalidParameterError(f"truncate_prompt_tokens ({keep}) is less than the "
                                        f"{keep - room} special tokens the tokenizer adds")
        return head + ids[end - room:end] + tail

    @functools.cached_property
    def _added_tokens(self) -> tuple[list[int], list[int]]:
        """The tokens encoding adds before and after a text (a template's, the same for any)."""
        bare, full = (self.tokenizer.encode("a", add_special_tokens=s) for s in (False, True))
        starts = range(len(full) - len(bare), -1, -1)  # no match: a head no prompt starts with
        start = next((i for i in starts if full[i:i + len(bare)] == bare), len(full))
        return full[:start], full[start + len(bare):]

"""vLLM's guided_choice: the output is exactly one of the given strings.

Each choice is encoded once, as the tokenizer spells it on its own, a special token's text read
as plain text (transformers' split_special_tokens): a choice is text, so "<|im_end|>" is written
with ordinary tokens, not as the end of the reply, which would leave it out of the reply's
text. At each step a request may sample only the tokens that go on with a choice its output so
far begins, and EOS once its output is a whole choice, so the text is always one of the choices
(cut short only by max_tokens). Other spellings of a choice are not offered: the tokenizer's own
is the one a model trained on its output knows best.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence

from inferlab.models.tokenizer import TextTokenizer


def choice_token_ids(tokenizer: TextTokenizer, choices: list[str]) -> list[list[int]]:
    literal = _literal_tokenizer(tokenizer) if choices else tokenizer
    return [literal.encode(choice, add_special_tokens=False) for choice in choices]


@functools.lru_cache(maxsize=4)
def _literal_tokenizer(tokenizer: TextTokenizer) -> TextTokenizer:
    """The tokenizer on a copy of its backend that reads special tokens' text as plain text. A
    copy, made once: the shared backend keeps reading them as special tokens, since other
    threads encode prompts with it meanwhile."""
    backend = copy.deepcopy(tokenizer.backend)
    backend.encode_special_tokens = True
    return TextTokenizer(backend, tokenizer.info)


class ChoiceGuide:
    """One request's choices as token ids; its output so far is a prefix of at least one."""

    def __init__(self, choices: list[list[int]], eos_token_id: int) -> None:
        self.choices = choices
        self.eos_token_id = eos_token_id

    def allowed_now(self, output: list[int], drafts: Sequence[int] = ()) -> list[int]:
        """The ids the next token may be, given the output so far and the drafts as if kept."""
        output = output + list(drafts) if drafts else output
        done = len(output)
        allowed = {ids[done] for ids in self.choices if len(ids) > done and ids[:done] == output}
        if any(ids == output for ids in self.choices):
            allowed.add(self.eos_token_id)
        return sorted(allowed)

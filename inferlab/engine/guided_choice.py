"""vLLM's guided_choice: the output is exactly one of the given strings.

Each choice is encoded once, as the tokenizer spells it on its own. At each step a request may
sample only the tokens that go on with a choice its output so far begins, and EOS once its
output is a whole choice, so the text is always one of the choices (cut short only by
max_tokens). Other spellings of a choice are not offered: the tokenizer's own is the one a
model trained on its output knows best.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferlab.models.tokenizer import TextTokenizer


def choice_token_ids(tokenizer: TextTokenizer, choices: list[str]) -> list[list[int]]:
    return [tokenizer.encode(choice, add_special_tokens=False) for choice in choices]


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

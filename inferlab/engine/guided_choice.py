"""vLLM's guided_choice: the output is exactly one of the given strings.

Each choice is encoded once, as the tokenizer spells it on its own. At each step a request may
sample only the tokens that go on with a choice its output so far begins, and EOS once its
output is a whole choice, so the text is always one of the choices (cut short only by
max_tokens). Other spellings of a choice are not offered: the tokenizer's own is the one a
model trained on its output knows best.
"""

from __future__ import annotations

from inferlab.models.tokenizer import TextTokenizer


def choice_token_ids(tokenizer: TextTokenizer, choices: list[str]) -> list[list[int]]:
    return [tokenizer.encode(choice, add_special_tokens=False) for choice in choices]


def allowed_now(choices: list[list[int]], output: list[int], eos_token_id: int) -> list[int]:
    """The ids the next token may be, given the output so far (a prefix of some choice)."""
    done = len(output)
    allowed = {ids[done] for ids in choices if len(ids) > done and ids[:done] == output}
    if any(ids == output for ids in choices):
        allowed.add(eos_token_id)
    return sorted(allowed)

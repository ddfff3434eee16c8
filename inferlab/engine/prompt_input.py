"""The prompts the in-process APIs take (LLM, AsyncEngine), read into texts and token id lists."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from inferlab.errors import InferlabError

# vLLM's PromptType as taken here: a text, a TextPrompt {"prompt": str}, a TokensPrompt
# {"prompt_token_ids": [int, ...]}, or a bare token id list (as vLLM once took them)
PromptType = str | Mapping[str, Any] | Sequence[int]

PROMPT_FORMS = "a str, a list of token ids, {'prompt': str} or {'prompt_token_ids': [int, ...]}"


def read_prompt(prompt: object, index: int = 0) -> str | list[int]:
    """Prompt `index` of a call as a text or token ids; an InferlabError that names it where it
    is none of PROMPT_FORMS."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping):
        return _read_prompt_dict(index, prompt)
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes | bytearray):
        return _token_ids(index, prompt)
    raise InferlabError(f"prompt {index} must be {PROMPT_FORMS}; got {type(prompt).__name__}")


def _read_prompt_dict(index: int, prompt: Mapping[str, Any]) -> str | list[int]:
    """A TextPrompt or a TokensPrompt; their other keys (multi_modal_data...) are refused by
    name rather than ignored."""
    key = "prompt_token_ids" if "prompt_token_ids" in prompt else "prompt"
    other = [repr(k) for k in prompt if k != key]
    if other or key not in prompt:
        what = f"{', '.join(other)} not supported" if other else "an empty dict"
        raise InferlabError(f"prompt {index}: {what} (a prompt dict holds 'prompt': str or "
                            "'prompt_token_ids': [int, ...] alone)")
    value = prompt[key]
    if key == "prompt":
        if not isinstance(value, str):
            raise InferlabError(f"prompt {index}: 'prompt' must be a str, "
                                f"got {type(value).__name__}")
        return value
    if not isinstance(value, Sequence) or isinstance(value, str | bytes | bytearray):
        raise InferlabError(f"prompt {index}: 'prompt_token_ids' must be a list of ints, "
                            f"got {type(value).__name__}")
    return _token_ids(index, value)


def _token_ids(index: int, ids: Sequence[Any]) -> list[int]:
    """Token ids as ints; numpy's integers are taken, a float or a str is not."""
    for position, token in enumerate(ids):
        if not is_token_id(token):
            raise InferlabError(f"prompt {index}: token ids must be integers, got "
                                f"{type(token).__name__} {token!r} at position {position}")
    return [int(t) for t in ids]


def is_token_id(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)

"""What a prompt leaves of the context for output, and the refusals a request and a beam search
share (the same words whichever asked)."""

from __future__ import annotations

from inferlab.errors import ContextLengthError


def output_room(prompt_tokens: int, max_model_len: int) -> int:
    """Tokens the context holds after the prompt; a prompt that leaves none is refused."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ContextLengthError(f"the prompt has {prompt_tokens} tokens, the context holds "
                                 f"{max_model_len}: no room for output")
    return room


def over_context(prompt_tokens: int, max_tokens: int, max_model_len: int,
                 field: str = "max_tokens") -> ContextLengthError:
    """An asked max_tokens (or min_tokens, `field`) the context cannot hold after the prompt, as
    vLLM's server words it."""
    return ContextLengthError(
        f"prompt ({prompt_tokens} tokens) + {field} ({max_tokens}) = {prompt_tokens + max_tokens} "
        f"is over the context length {max_model_len}")

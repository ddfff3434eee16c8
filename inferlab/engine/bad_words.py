"""What a request may not sample at a step: bad_words (SamplingParams) as the token id sequences
the sampler bars, and min_tokens' stop ids."""

from __future__ import annotations

from inferlab.engine.request import Request
from inferlab.models.tokenizer import TextTokenizer


def bad_words_token_ids(tokenizer: TextTokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word as token ids, as vLLM encodes them: the word alone, and again after a space
    when that spelling starts with another token and has as many (" word" is often one token of
    its own)."""
    encoded: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        encoded.append(bare)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            encoded.append(spaced)
    return encoded


def barred_now(request: Request, output: list[int]) -> list[int]:
    """Token ids the request may not sample after `output`: not_yet_allowed's, and each bad
    word's last token when the output ends with the tokens before it (vLLM's bad_words)."""
    barred = not_yet_allowed(request, len(output))  # a new list every call
    for ids in request.bad_words_token_ids:
        before = len(ids) - 1
        if before == 0 or (before <= len(output) and output[len(output) - before:] == ids[:-1]):
            barred.append(ids[-1])
    return barred


def not_yet_allowed(request: Request, num_output_tokens: int) -> list[int]:
    """vLLM's min_tokens: until the request has that many output tokens, its stop token ids
    and EOS (unless ignored) cannot be sampled, rather than sampled and then ignored."""
    params = request.sampling_params
    if num_output_tokens >= params.min_tokens:
        return []
    ids = list(params.stop_token_ids or ())
    if not params.ignore_eos and request.eos_token_id is not None:
        ids.append(request.eos_token_id)
    return ids

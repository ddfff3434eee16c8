"""The unique tag each synthetic request's prompt carries (file prompts are sent verbatim),
and the text prompt lengths are counted with.

Fixed-width decimal fields: every tag of a run then costs the same number of tokens in
vocabularies that split numbers into single digits or fixed groups, so a prompt cut to an
exact length with one tag has that length with any other. (Up to stage 99 and 10^7
requests a stage; past that the fields widen.) The request's number comes first: a prefix
cache matches whole blocks (16 tokens in vLLM), and the tag's first block must differ
between requests.
"""

from __future__ import annotations

import secrets

NONCE_DIGITS = 6


def new_nonce() -> str:
    """A run's nonce: decimal digits, like the rest of the tag."""
    return f"{secrets.randbelow(10 ** NONCE_DIGITS):0{NONCE_DIGITS}d}"


def request_tag(nonce: str, stage: int, index: int) -> str:
    """The text put into a request's prompt: unique per run, stage and request."""
    return f"[{index:07d}-{stage:02d}-{nonce}] "


REFERENCE_TAG = request_tag("0" * NONCE_DIGITS, 0, 0)  # what prompt lengths are counted with
# tags that differ in every digit: they cost the same unless a vocabulary merges digits unevenly
SAMPLE_TAGS = (REFERENCE_TAG, request_tag("9" * NONCE_DIGITS, 99, 9_999_999),
               request_tag("314159", 26, 5_358_979))


def tagged(text: str, at: int, tag: str = REFERENCE_TAG) -> str:
    """`text` with `tag` inserted at character `at`."""
    return text[:at] + tag + text[at:]

"""guided_choice's choices as token ids: each spelled as transformers spells its text with
split_special_tokens (the reference), a special token's text with ordinary tokens, so that the
reply decodes to exactly the choice (vLLM's choice grammar is over text the same way)."""

from __future__ import annotations

import pytest

from inferlab.engine.guided.guided_choice import ChoiceGuide, choice_token_ids
from inferlab.models.loader import load_tokenizer

CHOICES = ["a<|endoftext|>b", "<|im_end|>", "<|im_start|>assistant", "yes", "no way"]


@pytest.fixture(scope="module")
def tokenizer(embedded_gguf):
    return load_tokenizer(embedded_gguf)


def test_special_token_text_in_a_choice_is_spelled_with_ordinary_tokens(tokenizer, hf_smollm_tokenizer):
    for choice, ids in zip(CHOICES, choice_token_ids(tokenizer, CHOICES), strict=True):
        reference = hf_smollm_tokenizer(choice, add_special_tokens=False, split_special_tokens=True)
        assert ids == reference["input_ids"], choice
        assert not set(ids) & tokenizer.all_special_ids, choice
        assert tokenizer.decode(ids, skip_special_tokens=True) == choice  # as a reply is decoded


def test_the_end_of_the_reply_comes_only_after_a_whole_choice(tokenizer):
    guide = ChoiceGuide(choice_token_ids(tokenizer, ["<|im_end|>"]), tokenizer.eos_token_id)
    assert tokenizer.eos_token_id not in guide.allowed_now([])  # "<|im_end|>" is the EOS's text


def test_prompts_still_read_special_token_text_as_special_tokens(tokenizer):
    choice_token_ids(tokenizer, CHOICES)  # must leave the shared tokenizer as it was
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [tokenizer.eos_token_id]

"""A word-level tokenizer.json for the tiny models, with a template of special tokens."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [f"w{i}" for i in range(2, 60)]
SPECIALS = {"<unk>": 0, "<bos>": 1, "</s>": 2}
VOCAB = {**SPECIALS, **{word: i + 3 for i, word in enumerate(WORDS)}}


def make_tokenizer(template: str = "<bos> $A"):
    """A `tokenizers.Tokenizer` whose post-processor adds `template`'s special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(list(SPECIALS))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, i) for t, i in SPECIALS.items() if t in template])
    return tokenizer


def save_tokenizer(directory: Path, template: str = "<bos> $A") -> None:
    """tokenizer.json and tokenizer_config.json beside a model's weights."""
    make_tokenizer(template).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "</s>"}), encoding="utf-8")


def save_tiny_llama(directory: Path) -> str:
    """The tiny random Llama with this tokenizer, saved in `directory`; its path."""
    from tests.models.tiny_models import make_tiny_model

    make_tiny_model("llama", directory)
    save_tokenizer(directory)
    return str(directory)

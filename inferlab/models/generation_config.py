"""A model's own generation settings, from the generation_config.json beside its weights.

Two things in it change what a server answers, and vLLM reads both:
- `eos_token_id`: every token that ends a generation. Llama 3.1 Instruct lists <|end_of_text|>,
  <|eom_id|> and <|eot_id|>, Qwen2.5 Instruct <|im_end|> and <|endoftext|>; the tokenizer names
  only one of them.
- the sampling its authors recommend (temperature, top_p, top_k, min_p, repetition_penalty,
  max_new_tokens): vLLM's `--generation-config auto` (its default) makes them the defaults of
  requests that leave those fields out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from inferlab.errors import ModelLoadError
from inferlab.models.config import read_json_object, token_ids

FILE_NAME = "generation_config.json"
# generation_config.json's field -> SamplingParams' field
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}
_WHOLE_FIELDS = {"top_k", "max_tokens"}


@dataclass(frozen=True)
class GenerationConfig:
    eos_token_ids: tuple[int, ...] = ()  # empty: the file names none (config.json's then count)
    # SamplingParams field -> the model's default, for the fields the file sets
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def end_token_ids(self, config_ids: tuple[int, ...]) -> tuple[int, ...]:
        """The ids that end a generation: the file's, else the model config's."""
        return self.eos_token_ids or config_ids


def read_generation_config(directory: str) -> GenerationConfig:
    """The directory's generation_config.json; an empty config where there is none."""
    path = os.path.join(directory, FILE_NAME)
    if not os.path.isfile(path):
        return GenerationConfig()
    raw = read_json_object(path)
    try:
        eos_ids = token_ids("eos_token_id", raw.get("eos_token_id"))
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    return GenerationConfig(eos_ids, _sampling(raw, path))


def _sampling(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """The sampling fields the file sets, by SamplingParams' names; the engine checks their
    ranges as it checks a request's."""
    defaults = {ours: raw[theirs] for theirs, ours in SAMPLING_FIELDS.items()
                if raw.get(theirs) is not None}
    for name, value in defaults.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelLoadError(f"{path}: {name} must be a number, got {value!r}")
        if name in _WHOLE_FIELDS and value != int(value):
            raise ModelLoadError(f"{path}: {name} must be a whole number, got {value!r}")
    # a JSON writer's 20.0 is SamplingParams' 20, which takes integers only there
    return {name: int(value) if name in _WHOLE_FIELDS else value for name, value in defaults.items()}

"""What the model's generation_config.json decides for requests, as vLLM applies it.

- Its end-of-generation ids other than EOS join a request's stop token ids, unless the request
  ignores EOS (so a Llama 3.1 Instruct reply ends at <|eom_id|> and <|end_of_text|> too).
- Its sampling fields are the defaults of what a request leaves out, with --generation-config
  auto (vLLM's default); "vllm" keeps SamplingParams' own; a folder names another file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import ModelLoadError
from inferlab.models.generation_config import FILE_NAME, read_generation_config
from inferlab.models.loader import LoadedModel

logger = logging.getLogger("inferlab.engine")


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_id: int | None  # the request's EOS (tokenizer's, else the model's first end id)
    end_token_ids: tuple[int, ...]  # every id that ends a generation, EOS included
    sampling: dict[str, Any]  # SamplingParams field -> default, for what requests leave out

    @classmethod
    def resolve(cls, loaded: LoadedModel, source: str) -> GenerationDefaults:
        """source: EngineConfig.generation_config. Ids past the logits are dropped: they can
        never be sampled, and min_tokens would index past the logits holding them back."""
        folder = loaded.path if source in ("auto", "vllm") else source
        generation = loaded.generation if folder == loaded.path else read_generation_config(folder)
        if folder != loaded.path and not os.path.isfile(os.path.join(folder, FILE_NAME)):
            logger.warning("--generation-config %s holds no %s: no request defaults from it",
                           folder, FILE_NAME)  # a mistyped folder is otherwise silent
        sampling = {} if source == "vllm" else generation.sampling_defaults
        try:
            SamplingParams(**sampling)  # the checks a request's values get
        except ValueError as e:
            raise ModelLoadError(f"{os.path.join(folder, FILE_NAME)}: {e}") from None
        if sampling:
            logger.info("request defaults from %s: %s (--generation-config vllm ignores them)",
                        FILE_NAME, sampling)
        vocab, model_ends = loaded.config.vocab_size, loaded.config.eos_token_ids
        eos = loaded.tokenizer.eos_token_id
        if eos is None and model_ends:
            eos = model_ends[0]
        ends = tuple(t for t in generation.end_token_ids(model_ends) if t < vocab)
        return cls(eos if eos is not None and eos < vocab else None, ends, sampling)

    def default_params(self) -> SamplingParams:
        """What a request that sets nothing gets (vLLM's get_default_sampling_params)."""
        fields = {k: v for k, v in self.sampling.items() if k != "max_tokens"}
        if "max_tokens" in self.sampling:
            fields["max_tokens"] = None  # then max_tokens() caps the context's room
        return SamplingParams(**fields)

    def max_tokens(self, params: SamplingParams, room: int) -> int:
        """The request's own max_tokens, else the context's room within the model's cap."""
        if params.max_tokens is not None:
            return params.max_tokens
        return min(room, self.sampling.get("max_tokens", room))

    def with_end_tokens(self, params: SamplingParams) -> SamplingParams:
        """A request's own copy of its params, checked again (vLLM clones them at add: a caller
        that changes or reuses its object afterwards reaches no running request), with the
        model's other end tokens among its stop token ids."""
        extra = [t for t in self.end_token_ids
                 if t != self.eos_token_id and t not in params.stop_token_ids]
        if params.ignore_eos:
            return params.checked_copy()
        return params.checked_copy(stop_token_ids=[*params.stop_token_ids, *extra])

"""LLM: offline batch inference over one LLMEngine, with vLLM's LLM / SamplingParams shape."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from inferlab.config import EngineConfig, parse_bytes
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.chat_prompt import chat_prompt_text
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.outputs import RequestOutput
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from inferlab.models.loader import LoadedModel


def engine_config(model: str | None = None, **kwargs: Any) -> EngineConfig:
    """EngineConfig from keyword arguments; kv_cache_memory may be a string like '2GiB'."""
    if "kv_cache_memory" in kwargs:
        size = kwargs.pop("kv_cache_memory")
        kwargs["kv_cache_memory_bytes"] = None if size is None else parse_bytes(size)
    try:
        return EngineConfig(model=model, **kwargs)
    except TypeError as e:
        raise InferlabError(f"unknown engine option: {e}") from None



class LLM:
    """Offline batch inference: `LLM(model).generate(prompts, SamplingParams(...))`."""

    def __init__(self, model: str | None = None, loaded: LoadedModel | None = None,
                 **engine_args: Any) -> None:
        """`loaded` reuses weights already in memory (several engines over one model)."""
        self.engine = LLMEngine(engine_config(model, **engine_args), loaded)
        self.tokenizer = self.engine.tokenizer
        self._generating = threading.Lock()

    @property
    def num_kv_blocks(self) -> int:
        return self.engine.num_kv_blocks

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses without params: the model's generation_config.json defaults."""
        return self.engine.generation.default_params()

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """priority: one per prompt, with scheduling_policy="priority" (lower first)."""
        prompts = _prompt_list(prompts)
        params = params if params is not None else self.engine.generation.default_params()
        all_params = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        for name, values in (("sampling params", all_params), ("priorities", priorities)):
            if len(values) != len(prompts):
                raise InferlabError(f"{len(prompts)} prompts but {len(values)} {name}")
        if not self._generating.acquire(blocking=False):  # each call's steps ran the other's
            raise InferlabError("this LLM is already generating in another thread: an LLM is not "
                                "thread-safe (use one per thread, or AsyncEngine)")
        ids: list[str] = []
        try:
            for prompt, sp, rank in zip(prompts, all_params, priorities, strict=True):
                ids.append(self.engine.add_request(prompt, sp, priority=rank))
            return self._run(ids)
        except BaseException:  # a refused prompt or Ctrl-C: leave nothing queued for the next call
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        finally:
            self._generating.release()

    def chat(self, conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True,
             chat_template: str | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: messages with text or text parts (chat_prompt.py); params: one for
        all, or one per conversation, as generate takes them; chat_template:
        instead of the model's; chat_template_kwargs: more variables for it; tools: OpenAI-style
        tool definitions, the template's `tools`; continue_final_message: the reply goes on
        from the last message (with add_generation_prompt=False)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [chat_prompt_text(self.tokenizer, c, add_generation_prompt, continue_final_message,
                                    chat_template, chat_template_kwargs, tools)
                   for c in conversations]
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(ids, params)

    def beam_search(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                    params: BeamSearchParams) -> list[RequestOutput]:
        """vLLM's LLM.beam_search: each prompt's best params.beam_width beams, best first, as
        the completions of one output (beam_search.py says how they are found)."""
        prompts = _prompt_list(prompts)
        searches = [self.engine.start_beam_search(prompt, params) for prompt in prompts]
        while active := [search for _, search in searches if not search.done]:
            outputs = self.generate([beam for search in active for beam in search.beams()],
                                    params.round_params())
            for search in active:
                taken = len(search.live)
                search.advance(outputs[:taken])
                outputs = outputs[taken:]
        return [search.output(f"beam-{i}", self.tokenizer, text)
                for i, (text, search) in enumerate(searches)]

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step(final_only=True):
                final[out.request_id] = out
        return [final[i] for i in request_ids]


def _prompt_list(prompts: str | Sequence[str] | Sequence[Sequence[int]]) -> list:
    """One prompt (a text or a token id list) or many, as a list of prompts."""
    if not isinstance(prompts, str | Sequence):  # None, a bare token id...
        raise InferlabError(f"prompts must be a str, a list of str or of token id lists, "
                            f"got {type(prompts).__name__}")
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)

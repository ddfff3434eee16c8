"""LLM: offline batch inference over one LLMEngine, with vLLM's LLM / SamplingParams shape."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferlab.config import EngineConfig, parse_bytes
from inferlab.engine.beam_search import BeamSearchOutput, BeamSearchParams
from inferlab.engine.chat_prompt import chat_prompt_text
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.outputs import RequestOutput
from inferlab.engine.prompt_input import PROMPT_FORMS, PromptType, is_token_id, read_prompt
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from inferlab.models.loader import LoadedModel
from inferlab.models.tokenizer import TextTokenizer

Params = SamplingParams | Sequence[SamplingParams] | None
Progress = bool | Callable[..., Any]  # vLLM's use_tqdm: a bar or not, or the tqdm class to use


def engine_config(model: str | None = None, **kwargs: Any) -> EngineConfig:
    """EngineConfig from keyword arguments; kv_cache_memory may be a string like '2GiB'."""
    if "kv_cache_memory" in kwargs:
        size = kwargs.pop("kv_cache_memory")
        kwargs["kv_cache_memory_bytes"] = None if size is None else parse_bytes(size, "kv_cache_memory")
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

    def get_tokenizer(self) -> TextTokenizer:
        """The tokenizer prompts and chats are encoded with (vLLM's LLM.get_tokenizer)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses without sampling_params: generation_config.json's defaults."""
        return self.engine.generation.default_params()

    def generate(self, prompts: PromptType | Sequence[PromptType], sampling_params: Params = None,
                 *, use_tqdm: Progress = True,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """vLLM's LLM.generate. sampling_params: one for all prompts or one each; use_tqdm: a
        progress bar of the prompts done, on stderr (or a tqdm-like class to make it with);
        priority: one per prompt, with scheduling_policy="priority" (lower first). As in
        vLLM's offline engine, a request whose max_tokens reach past the context ends there
        ("length") rather than being refused."""
        return self._generate(_prompt_list(prompts), sampling_params, use_tqdm, priority)

    def chat(self, messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
             sampling_params: Params = None,
             use_tqdm: Progress = True,
             *, add_generation_prompt: bool = True,
             chat_template: str | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: a conversation or a list of them, of messages with text or text
        parts (chat_prompt.py); sampling_params and use_tqdm as generate takes them;
        chat_template: instead of the model's; chat_template_kwargs: more variables for it;
        tools: OpenAI-style tool definitions, the template's `tools`; continue_final_message:
        the reply goes on from the last message (with add_generation_prompt=False)."""
        if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
            raise InferlabError(f"messages must be a list of messages or a list of such lists, "
                                f"got {type(messages).__name__}")
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else messages
        prompts = [chat_prompt_text(self.tokenizer, c, add_generation_prompt, continue_final_message,
                                    chat_template, chat_template_kwargs, tools)
                   for c in conversations]
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        outputs = self._generate(ids, sampling_params, use_tqdm, None)
        for out, text, whole in zip(outputs, prompts, ids, strict=True):
            # vLLM's: the rendered conversation, unless truncate_prompt_tokens cut its ids
            out.prompt = text if len(out.prompt_token_ids) == len(whole) else None
        return outputs

    def beam_search(self, prompts: PromptType | Sequence[PromptType],
                    params: BeamSearchParams) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: each prompt's best params.beam_width beams, best first, as
        vLLM's `sequences` and as the completions of one output (beam_search.py says how they
        are found)."""
        if not isinstance(params, BeamSearchParams):  # a dict once failed deep in the engine
            raise InferlabError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        searches = [self.engine.start_beam_search(p, params) for p in _prompt_list(prompts)]
        while active := [search for _, search in searches if not search.done]:
            outputs = self._generate([beam for search in active for beam in search.beams()],
                                     params.round_params(), False, None)
            for search in active:
                taken = len(search.live)
                search.advance(outputs[:taken])
                outputs = outputs[taken:]
        return [search.output(f"beam-{i}", self.tokenizer, text, self.engine.outputs.decoded_tokens)
                for i, (text, search) in enumerate(searches)]

    def _generate(self, prompts: list[str | list[int]], params: Params,
                  use_tqdm: Progress, priority: Sequence[int] | None,
                  ) -> list[RequestOutput]:
        """generate() on prompts already read."""
        params = params if params is not None else self.engine.generation.default_params()
        many = isinstance(params, Sequence) and not isinstance(params, str)
        all_params = list(params) if many else [params] * len(prompts)
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        for name, values in (("sampling params", all_params), ("priorities", priorities)):
            if len(values) != len(prompts):
                raise InferlabError(f"{len(prompts)} prompts but {len(values)} {name}")
        wrong = [type(p).__name__ for p in all_params if not isinstance(p, SamplingParams)]
        if wrong:
            raise InferlabError(f"sampling_params must be a SamplingParams or a list of them, got {wrong[0]}")
        if not self._generating.acquire(blocking=False):  # each call's steps ran the other's
            raise InferlabError("this LLM is already generating in another thread: an LLM is not "
                                "thread-safe (use one per thread, or AsyncEngine)")
        ids: list[str] = []
        try:
            for prompt, sp, rank in zip(prompts, all_params, priorities, strict=True):
                ids.append(self.engine.add_request(prompt, sp, priority=rank, cap_max_tokens=True))
            return self._run(ids, use_tqdm)
        except BaseException:  # a refused prompt or Ctrl-C: leave nothing queued for the next call
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        finally:
            self._generating.release()

    def _run(self, request_ids: list[str], use_tqdm: Progress) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        bar = _progress_bar(use_tqdm, len(request_ids))
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step(final_only=True):
                    final[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [final[i] for i in request_ids]


def _progress_bar(use_tqdm: Progress, total: int) -> Any:
    """vLLM's bar of processed prompts; use_tqdm may be the tqdm class (or look-alike) to use."""
    if not use_tqdm:
        return None
    if callable(use_tqdm):
        make = use_tqdm
    else:
        from tqdm.auto import tqdm as make  # only when asked: no import cost otherwise
    return make(total=total, desc="Processed prompts", dynamic_ncols=True)


def _prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[str | list[int]]:
    """One prompt or a list of them, as texts and token id lists."""
    if isinstance(prompts, str | Mapping) or (isinstance(prompts, Sequence) and prompts
                                              and is_token_id(prompts[0])):
        prompts = [prompts]  # type: ignore[list-item]
    if not isinstance(prompts, Sequence) or isinstance(prompts, bytes | bytearray):
        raise InferlabError(f"prompts must be {PROMPT_FORMS}, or a list of them; "
                            f"got {type(prompts).__name__}")
    return [read_prompt(prompt, i) for i, prompt in enumerate(prompts)]

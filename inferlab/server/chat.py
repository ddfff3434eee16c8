"""POST /v1/chat/completions: messages through the model's chat template, reply whole or streamed."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.chat_prompt import ChatError, chat_prompt_text, message_text
from inferlab.engine.outputs import RequestOutput, TokenLogprobs
from inferlab.engine.sampling_params import SamplingParams
from inferlab.models.tokenizer import TextTokenizer
from inferlab.server.context import ServerContext
from inferlab.server.errors import bad_request
from inferlab.server.generation import Generation
from inferlab.server.logprobs import chat_logprobs
from inferlab.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatMessage,
    ReplyMessage,
    usage_asked,
)
from inferlab.server.reasoning import REASONING_PARSERS
from inferlab.server.reply import ReplyReader
from inferlab.server.respond import asked_ids, read_request, respond
from inferlab.server.sampling import beam_search_params, chat_params
from inferlab.server.sse import event
from inferlab.server.tool_parsers import ToolParser
from inferlab.server.tools import ToolUse, tool_use


async def create_chat_completion(request: Request, ctx: ServerContext) -> Response:
    req = await read_request(request, ctx, ChatCompletionRequest)
    # in a worker thread, as completions do: the tools' and the guide's schemas compile there
    tools, params, beam = await asyncio.to_thread(_sampling, req, ctx)
    # in a worker thread: encoding lets go of the GIL, so the loop goes on streaming meanwhile
    fits = None if req.truncate_prompt_tokens is not None else ctx.engine.check_text_fits
    prompt_ids = await asyncio.to_thread(
        chat_prompt_ids, ctx.engine.tokenizer, req.messages, req.add_generation_prompt,
        req.continue_final_message, req.add_special_tokens, ctx.settings.chat_template,
        req.chat_template_kwargs, fits, tools.template_tools)
    gen = await ctx.generate(request, [prompt_ids], params, req.priority, beam)
    fmt = _Formatter(ctx, req, gen, f"chatcmpl-{request.state.request_id}", tools.parser)
    return await respond(request, gen, req.stream, fmt.stream, fmt.whole)


def _sampling(req: ChatCompletionRequest, ctx: ServerContext,
              ) -> tuple[ToolUse, SamplingParams, BeamSearchParams | None]:
    """The request's tools, sampling params and beam search, checked."""
    tools = tool_use(req, ctx.settings)
    params = chat_params(req, ctx.engine.sampling_defaults, tools.schema,
                         keep_special_tokens=_marks_special(tools, ctx.engine.tokenizer))
    beam = beam_search_params(req, params)
    if beam is not None and tools.parser is not None:
        raise bad_request("beam search does not take tool calls", "tool_choice")
    if ctx.settings.reasoning_parser and params.guided_by:  # the guide holds the answer only
        markers = REASONING_PARSERS[ctx.settings.reasoning_parser].guide_markers
        params = params.checked_copy(guide_after_thinking=markers)
    return tools, params, beam


def _marks_special(tools: ToolUse, tokenizer: TextTokenizer) -> bool:
    """Whether the tool parser looks for a special token (Llama 3's <|python_tag|>): then the
    reply's text must keep them, as vLLM's parsers ask."""
    return any(_is_special(tokenizer, marker) for marker in tools.markers)


@functools.lru_cache(maxsize=64)
def _is_special(tokenizer: TextTokenizer, marker: str) -> bool:
    """Whether `marker` encodes to a special token: asked for each request, encoded once."""
    return bool(set(tokenizer.encode(marker, add_special_tokens=False)) & tokenizer.all_special_ids)


def chat_prompt_ids(tokenizer: TextTokenizer, messages: list[ChatMessage],
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    add_special_tokens: bool = False, template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    check_fits: Callable[[int], None] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """chat_prompt_text's (engine/chat_prompt.py) for the request's messages, encoded: template,
    the server's --chat-template (None: the model's)."""
    try:
        text = chat_prompt_text(tokenizer, [_as_dict(m) for m in messages], add_generation_prompt,
                                continue_final_message, template, template_kwargs, tools, check_fits)
    except ChatError as e:
        raise bad_request(str(e), e.param) from None
    # the template writes the special tokens; add_special_tokens adds the tokenizer's (a BOS) too
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _as_dict(message: ChatMessage) -> dict[str, Any]:
    return message.model_dump(exclude_none=True)


def _reply_role(req: ChatCompletionRequest) -> str:
    """vLLM's: the assistant's when the generation prompt opens its turn; without one the reply
    goes on with the last message's turn, so it is in that message's role."""
    return "assistant" if req.add_generation_prompt else req.messages[-1].role


def _echoed(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text goes before the reply when it is in the
    reply's role."""
    last = req.messages[-1]
    if not req.echo or last.role != _reply_role(req):
        return ""
    return message_text(_as_dict(last), len(req.messages) - 1)  # checked when the prompt was built


class _Formatter:
    def __init__(self, ctx: ServerContext, req: ChatCompletionRequest, gen: Generation,
                 response_id: str, parser: Callable[[], ToolParser] | None) -> None:
        self.ctx = ctx
        self.req = req
        self.gen = gen
        self.id = response_id
        self.model = ctx.reply_model_name(req.model)
        self.created = int(time.time())
        self.num_top = req.top_logprobs or 0
        self.names = ctx.token_names(req.return_tokens_as_token_ids)
        self.role = _reply_role(req)
        self.echo = _echoed(req)
        thinking = ctx.settings.reasoning_parser
        guided = gen.params.guide_after_thinking is not None
        self.replies = [ReplyReader(parser() if parser else None,
                                    REASONING_PARSERS[thinking](guided=guided) if thinking else None,
                                    req.include_reasoning, req.parallel_tool_calls is not False)
                        for _ in range(gen.params.n)]

    def whole(self, finals: list[RequestOutput]) -> ChatCompletion:
        (final,) = finals  # chat has one prompt
        choices = []
        for c in final.outputs:
            reply = self.replies[c.index]
            reasoning, parsed = reply.read(c.text, finished=True)
            # a stream has sent its calls' pieces as they came; a whole reply is read as vLLM
            # reads one: no calls where they cannot be read (its text given back, unforced)
            content = self.echo + (reply.drop_calls() if reply.calls_unreadable() else parsed.content)
            # vLLM's: a reply that is all thinking (shown or not), or all calls, has no content
            message = ReplyMessage(
                role=self.role,
                content=content if content or not (reply.names or reply.thought) else None,
                reasoning=reasoning or None, reasoning_content=reasoning or None,
                tool_calls=reply.calls)
            choices.append(ChatChoice(index=c.index, message=message,
                                      logprobs=self._logprobs(c.logprobs),
                                      finish_reason=reply.finish_reason(c.finish_reason),
                                      stop_reason=c.stop_reason, token_ids=asked_ids(self.req, c.token_ids)))
        return ChatCompletion(id=self.id, created=self.created, model=self.model,
                              choices=choices, usage=self.gen.usage(),
                              prompt_token_ids=asked_ids(self.req, final.prompt_token_ids))

    async def stream(self) -> AsyncIterator[bytes]:
        # continuous: each chunk counts its own choice's tokens so far (vLLM's)
        final_usage, continuous = usage_asked(self.req.stream_options)
        for i in range(self.gen.params.n):
            yield self._chunk(ChatChunkChoice(index=i, delta={"role": self.role, "content": ""}),
                              0 if continuous else None,
                              asked_ids(self.req, self.gen.prompt_token_ids(0)) if i == 0 else None)
        for i in range(self.gen.params.n if self.echo else 0):
            yield self._chunk(ChatChunkChoice(index=i, delta={"content": self.echo}),
                              0 if continuous else None)
        finished: set[int] = set()
        async for _, out in self.gen.outputs():
            for c in out.outputs:
                if c.index in finished:
                    continue
                reply = self.replies[c.index]
                so_far = len(c.token_ids) if continuous else None
                delta = reply.delta(*reply.read(c.text_delta, c.finished))
                logprobs = self._logprobs(c.logprobs_delta) if c.token_ids_delta else None
                ids = asked_ids(self.req, c.token_ids_delta) if c.token_ids_delta else None
                if delta or (logprobs is not None and logprobs.content) or ids:
                    yield self._chunk(ChatChunkChoice(index=c.index, delta=delta or {"content": ""},
                                                      logprobs=logprobs, token_ids=ids), so_far)
                if c.finished:
                    finished.add(c.index)
                    yield self._chunk(ChatChunkChoice(
                        index=c.index, delta={}, finish_reason=reply.finish_reason(c.finish_reason),
                        stop_reason=c.stop_reason), so_far)
        if final_usage:
            yield event(ChatCompletionChunk(id=self.id, created=self.created,
                                            model=self.model, choices=[],
                                            usage=self.gen.usage()))

    def _chunk(self, choice: ChatChunkChoice, choice_tokens: int | None,
               prompt_token_ids: list[int] | None = None) -> bytes:
        """choice_tokens: the choice's tokens so far, for continuous usage stats; None: no usage."""
        usage = None if choice_tokens is None else self.gen.prompt_usage(0, choice_tokens)
        return event(ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                         choices=[choice], usage=usage,
                                         prompt_token_ids=prompt_token_ids))

    def _logprobs(self, entries: Sequence[TokenLogprobs] | None) -> ChatLogprobs | None:
        if entries is None or not self.req.logprobs:
            return None
        return ChatLogprobs(content=chat_logprobs(entries, self.names, self.ctx.token_texts.spelling,
                                                   self.num_top))

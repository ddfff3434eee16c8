"""POST /v1/completions: prompts in, text out, whole or streamed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import Response

from inferlab.engine.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from inferlab.server.context import ServerContext
from inferlab.server.errors import bad_request
from inferlab.server.generation import Generation
from inferlab.server.logprobs import TextOffsets, append_completion_logprobs, prompt_logprobs
from inferlab.server.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptLogprob,
    usage_asked,
)
from inferlab.server.respond import asked_ids, read_request, respond
from inferlab.server.sampling import beam_search_params, completion_params, echo_only
from inferlab.server.sse import event


async def create_completion(request: Request, ctx: ServerContext) -> Response:
    req = await read_request(request, ctx, CompletionRequest)
    prompts = _prompts(req.prompt)
    if not req.add_special_tokens:  # text prompts encoded here, without the tokenizer's BOS
        truncating = req.truncate_prompt_tokens is not None
        prompts = [(await asyncio.to_thread(ctx.engine.tokenize_prompt, p, truncating, False))[1]
                   if isinstance(p, str) else p for p in prompts]
    # in a worker thread: a guide's schema or grammar compiles in Python for up to seconds, and
    # on the event loop it held every other client (and /health) that long
    params = await asyncio.to_thread(completion_params, req, ctx.engine.sampling_defaults)
    gen = await ctx.generate(request, prompts, params, req.priority, beam_search_params(req, params))
    fmt = _Formatter(ctx, req, gen, f"cmpl-{request.state.request_id}")
    return await respond(request, gen, req.stream, fmt.stream, fmt.whole)


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("'prompt' must not be an empty list", "prompt")
    if isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


@dataclass
class _ChoiceState:
    started: bool = False  # the echoed prompt has been sent
    offsets: TextOffsets = field(default_factory=TextOffsets)  # for logprobs.text_offset


class _Formatter:
    def __init__(self, ctx: ServerContext, req: CompletionRequest, gen: Generation,
                 response_id: str) -> None:
        self.ctx = ctx
        self.req = req
        self.gen = gen
        self.id = response_id
        self.model = ctx.reply_model_name(req.model)
        self.created = int(time.time())
        self.states: dict[tuple[int, int], _ChoiceState] = {}
        self.names = ctx.token_names(req.return_tokens_as_token_ids)
        self.echo_only = echo_only(req)

    def whole(self, finals: list[RequestOutput]) -> Completion:
        choices = [self._choice(p, out, c, c.text, c.token_ids, c.logprobs)
                   for p, out in enumerate(finals) for c in out.outputs]
        return Completion(id=self.id, created=self.created, model=self.model,
                          choices=choices, usage=self.gen.usage(not self.echo_only))

    async def stream(self) -> AsyncIterator[bytes]:
        # continuous: each chunk counts its prompt and its own choice's tokens (vLLM's)
        final_usage, continuous = usage_asked(self.req.stream_options)
        finished: set[tuple[int, int]] = set()
        async for p, out in self.gen.outputs():
            for c in out.outputs:
                key = (p, c.index)
                if key in finished or not self._has_news(key, c):
                    continue
                if c.finished:
                    finished.add(key)
                choice = self._choice(p, out, c, c.text_delta, c.token_ids_delta, c.logprobs_delta)
                done = 0 if self.echo_only else len(c.token_ids)  # echo_only: no sampled token
                usage = self.gen.prompt_usage(p, done) if continuous else None
                yield event(Completion(id=self.id, created=self.created, model=self.model,
                                       choices=[choice], usage=usage))
        if final_usage:
            yield event(Completion(id=self.id, created=self.created, model=self.model,
                                   choices=[], usage=self.gen.usage(not self.echo_only)))

    def _has_news(self, key: tuple[int, int], c: CompletionOutput) -> bool:
        if c.text_delta or c.finished or (self.req.echo and key not in self.states):
            return True
        wants_tokens = self.req.logprobs is not None or self.req.return_token_ids
        return wants_tokens and bool(c.token_ids_delta)

    def _choice(self, p: int, out: RequestOutput, c: CompletionOutput, text: str,
                token_ids: Sequence[int], entries: Sequence[TokenLogprobs] | None) -> CompletionChoice:
        state = self.states.setdefault((p, c.index), _ChoiceState())
        if self.echo_only:  # the token the engine sampled is not part of the reply
            text, token_ids, entries = "", (), None
        top_n = self.req.logprobs
        logprobs = CompletionLogprobs() if top_n is not None else None
        prompt_entries = prompt_ids = None
        if not state.started:  # a choice's first chunk carries what is about the prompt
            state.started = True
            prompt_entries = self._prompt_logprobs(out)
            prompt_ids = out.prompt_token_ids
            text = self._echo(out, logprobs, state) + text
        if logprobs is not None and entries:
            append_completion_logprobs(logprobs, token_ids, entries, self.ctx.token_texts,
                                       state.offsets, top_n, self.names)
        return CompletionChoice(index=p * self.gen.params.n + c.index, text=text, logprobs=logprobs,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                prompt_logprobs=prompt_entries, prompt_token_ids=asked_ids(self.req, prompt_ids),
                                token_ids=asked_ids(self.req, token_ids))

    def _prompt_logprobs(self, out: RequestOutput) -> list[dict[int, PromptLogprob] | None] | None:
        top_n = self.req.prompt_logprobs
        if top_n is None or out.prompt_logprobs is None:
            return None
        return prompt_logprobs(out.prompt_token_ids, out.prompt_logprobs, self.ctx.token_texts, top_n)

    def _echo(self, out: RequestOutput, logprobs: CompletionLogprobs | None, state: _ChoiceState) -> str:
        """The prompt's text when echo asks (its logprobs go into `logprobs`), else ""."""
        if not self.req.echo:
            return ""
        # a prompt of token ids echoes as vLLM's does: all of them, special tokens too
        prompt_text = out.prompt if out.prompt is not None else \
            self.ctx.engine.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
        if logprobs is not None and out.prompt_logprobs is not None:
            offsets = TextOffsets()
            append_completion_logprobs(logprobs, out.prompt_token_ids, out.prompt_logprobs,
                                       self.ctx.token_texts, offsets, self.req.logprobs,
                                       self.names)
            # a text can lack what its tokens spell at its start (a BOS its string never had,
            # the space SentencePiece puts before the first word): they are placed from its
            # end, where the reply goes on, so the offsets never run back
            missing = offsets.chars - len(prompt_text)
            if missing > 0:
                logprobs.text_offset[:] = [max(0, o - missing) for o in logprobs.text_offset]
        state.offsets = TextOffsets(len(prompt_text))
        return prompt_text

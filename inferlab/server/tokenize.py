"""POST /tokenize and /detokenize, as vLLM answers them."""

from __future__ import annotations

import asyncio

from fastapi import Request

from inferlab.errors import InferlabError
from inferlab.server.body import parse_body
from inferlab.server.chat import chat_prompt_ids
from inferlab.server.context import ServerContext
from inferlab.server.errors import bad_request
from inferlab.server.protocol import DetokenizeRequest, TokenizeRequest


async def tokenize(request: Request, ctx: ServerContext) -> dict:
    req = parse_body(TokenizeRequest, await ctx.read_body(request))
    ctx.check_model(req.model)
    tokenizer = ctx.engine.tokenizer
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of 'prompt' and 'messages'")
    # in a worker thread, as the generation routes encode: the loop goes on streaming meanwhile
    if req.prompt is not None:
        tokens = await asyncio.to_thread(tokenizer.encode, req.prompt,
                                         req.add_special_tokens is not False)
    else:
        assert req.messages is not None
        tokens = await asyncio.to_thread(
            chat_prompt_ids, tokenizer, req.messages, req.add_generation_prompt,
            req.continue_final_message, add_special_tokens=req.add_special_tokens is True,
            template=ctx.settings.chat_template, template_kwargs=req.chat_template_kwargs,
            tools=None if req.tools is None else [t.model_dump(exclude_none=True) for t in req.tools])
    strings = [tokenizer.id_to_token(t) for t in tokens] if req.return_token_strs else None
    return {"count": len(tokens), "max_model_len": ctx.engine.max_model_len, "tokens": tokens,
            "token_strs": strings}


async def detokenize(request: Request, ctx: ServerContext) -> dict:
    req = parse_body(DetokenizeRequest, await ctx.read_body(request))
    ctx.check_model(req.model)
    try:
        ctx.engine.tokenize_prompt(req.tokens)  # checks every id is in the vocabulary
    except InferlabError as e:
        raise bad_request(str(e), "tokens") from None
    # vLLM's create_detokenize calls tokenizer.decode(ids), which keeps special tokens
    return {"prompt": ctx.engine.tokenizer.decode(req.tokens, skip_special_tokens=False)}

"""Request bodies serialised ahead of time, with a slot for each request's unique tag.

A worker builds a request by concatenating `head + tag + tail`: no JSON encoding on
the timing path, and every request differs from the first prompt tokens on (after any
intended shared prefix), whichever template it reuses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from inferlab.bench.datasets import Prompt
from inferlab.bench.tags import tagged
from inferlab.errors import InferlabError

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
_SLOT = "\u0000TAG\u0000"  # cannot occur in a JSON-encoded prompt (NUL is escaped)


@dataclass(frozen=True)
class BodyOptions:
    """What every request of a run asks, besides its prompt."""

    model: str
    chat: bool
    force_length: bool  # send ignore_eos so the output is exactly max_tokens long
    continuous_usage: bool = False  # ask for usage in every chunk (vLLM extension)
    extra: tuple[tuple[str, object], ...] = ()  # user's --extra-body fields

    @property
    def path(self) -> str:
        return CHAT_PATH if self.chat else COMPLETIONS_PATH


@dataclass(frozen=True)
class RequestTemplate:
    head: bytes  # JSON body up to the tag
    tail: bytes  # JSON body after the tag
    prompt_tokens: int  # with the tag; exact with --tokenizer, else an estimate
    output_tokens: int | None  # max_tokens asked

    def body(self, tag: str) -> bytes:
        return self.head + tag.encode() + self.tail


def make_template(prompt: Prompt, options: BodyOptions) -> RequestTemplate:
    body: dict[str, object] = {"model": options.model}
    if options.chat:
        body["messages"] = _tagged_messages(prompt)
    else:
        text = prompt.text if prompt.text is not None else _single_message(prompt)
        body["prompt"] = tagged(text, prompt.tag_at, _SLOT)
    if prompt.output_tokens is not None:
        body["max_tokens"] = prompt.output_tokens
        if options.force_length:
            body["ignore_eos"] = True
    body["stream"] = True
    usage = {"include_usage": True}
    if options.continuous_usage:
        usage["continuous_usage_stats"] = True
    body["stream_options"] = usage
    body.update(dict(options.extra))
    head, tail = json.dumps(body).split(json.dumps(_SLOT)[1:-1])
    return RequestTemplate(head.encode(), tail.encode(), prompt.prompt_tokens,
                           prompt.output_tokens)


def _tagged_messages(prompt: Prompt) -> list[dict]:
    if prompt.messages is None:
        text = prompt.text or ""
        return [{"role": "user", "content": tagged(text, prompt.tag_at, _SLOT)}]
    messages = [dict(m) for m in prompt.messages]
    first_user = next((m for m in messages if m["role"] == "user"), messages[0])
    content = first_user["content"]
    first_user["content"] = tagged(content, prompt.tag_at, _SLOT)
    return messages


def _single_message(prompt: Prompt) -> str:
    """A one-message chat record sent to /v1/completions: its content is the prompt."""
    messages = prompt.messages or ()
    if len(messages) != 1:
        raise InferlabError("multi-message chat records need --endpoint chat")
    return messages[0]["content"]

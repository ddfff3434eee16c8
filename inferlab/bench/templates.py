"""Request bodies serialised ahead of time, with a slot for each request's unique tag.

A worker builds a request by concatenating `head + tag + tail`: no JSON encoding on
the timing path, and every synthetic request differs from the first prompt tokens on (after
any intended shared prefix), whichever template it reuses. A prompt from a file has no slot:
it is sent verbatim, as guidellm and `vllm bench serve` send dataset prompts, so a file's
shared prefixes reach the server's prefix cache as they would in production. A file row's
prefix column is sent as guidellm sends it: before the text, or as a first system message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from inferlab.bench.datasets import Prompt
from inferlab.bench.tags import tagged
from inferlab.errors import InferlabError

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class BodyOptions:
    """What every request of a run asks, besides its prompt."""

    model: str
    chat: bool
    # send ignore_eos so the output is exactly max_tokens long; None: for the prompts whose
    # length is a count (synthetic ones, a file row's output_tokens_count), as guidellm does
    force_length: bool | None
    continuous_usage: bool = False  # ask for usage in every chunk (vLLM extension)
    extra: tuple[tuple[str, object], ...] = ()  # user's --extra-body fields


@dataclass(frozen=True)
class RequestTemplate:
    head: bytes  # JSON body up to the tag (all of it when untagged)
    tail: bytes  # JSON body after the tag
    prompt_tokens: int  # as sent, any tag in; exact with --tokenizer, else an estimate
    output_tokens: int | None  # max_tokens asked
    tagged: bool = True  # False: the prompt is sent verbatim, whatever the tag
    ignore_eos: bool = False  # sent with ignore_eos: output_tokens is the length wanted

    def body(self, tag: str) -> bytes:
        return self.head + tag.encode() + self.tail if self.tagged else self.head + self.tail


def make_template(prompt: Prompt, options: BodyOptions) -> RequestTemplate:
    ignore_eos = _ignores_eos(prompt, options)
    if prompt.tag_at is None:
        return RequestTemplate(json.dumps(_body(prompt, options, "")).encode(), b"",
                               prompt.prompt_tokens, prompt.output_tokens, tagged=False,
                               ignore_eos=ignore_eos)
    head, tail = _split_at_slot(prompt, options)
    return RequestTemplate(head.encode(), tail.encode(), prompt.prompt_tokens,
                           prompt.output_tokens, ignore_eos=ignore_eos)


def _ignores_eos(prompt: Prompt, options: BodyOptions) -> bool:
    """--ignore-eos or not, else as the prompt asks: an output count wants exactly that many
    tokens, a max_tokens is a ceiling."""
    if prompt.output_tokens is None:
        return False
    return prompt.exact_output if options.force_length is None else options.force_length


def _body(prompt: Prompt, options: BodyOptions, slot: str) -> dict[str, object]:
    """The request's JSON body, `slot` put where the tag goes."""
    body: dict[str, object] = {"model": options.model}
    if options.chat:
        body["messages"] = _tagged_messages(prompt, slot)
    else:
        text = prompt.text if prompt.text is not None else _single_message(prompt)
        text = tagged(text, prompt.tag_at or 0, slot)
        # guidellm joins a row's prefix and text with a space
        body["prompt"] = f"{prompt.prefix} {text}" if prompt.prefix else text
    if prompt.output_tokens is not None:
        body["max_tokens"] = prompt.output_tokens
        if _ignores_eos(prompt, options):
            body["ignore_eos"] = True
    body["stream"] = True
    usage = {"include_usage": True}
    if options.continuous_usage:
        usage["continuous_usage_stats"] = True
    body["stream_options"] = usage
    body.update(dict(options.extra))
    return body


def _split_at_slot(prompt: Prompt, options: BodyOptions) -> tuple[str, str]:
    """The serialised body before and after the tag's slot. A prompt or an --extra-body
    value may hold any text, NUL characters included: a marker is taken that occurs once in
    the body, where the slot is (no text next to it completes a second one)."""
    number = 0
    while True:
        slot = f"\u0000TAG{number}\u0000"
        marker = json.dumps(slot)[1:-1]
        body = json.dumps(_body(prompt, options, slot))
        at = body.find(marker)
        if at == body.rfind(marker):
            return body[:at], body[at + len(marker):]
        number += 1


def _tagged_messages(prompt: Prompt, slot: str) -> list[dict]:
    # a row's prefix goes first, as a system message, as guidellm sends it
    system = [{"role": "system", "content": prompt.prefix}] if prompt.prefix else []
    if prompt.messages is None:
        text = prompt.text or ""
        return [*system, {"role": "user", "content": tagged(text, prompt.tag_at or 0, slot)}]
    messages = [dict(m) for m in prompt.messages]
    if prompt.tag_at is not None:
        first_user = next((m for m in messages if m["role"] == "user"), messages[0])
        first_user["content"] = tagged(first_user["content"], prompt.tag_at, slot)
    return [*system, *messages]


def _single_message(prompt: Prompt) -> str:
    """A one-message chat record sent to /v1/completions: its content is the prompt."""
    messages = prompt.messages or ()
    if len(messages) != 1:
        raise InferlabError("multi-message chat records need --endpoint chat")
    return messages[0]["content"]

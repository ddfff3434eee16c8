"""A conversation, OpenAI's messages as dicts, through a model's chat template: for LLM.chat and
for the server's chat completions and /tokenize. A message's content is text, None, or a list
of text parts (bare strings among them, as vLLM takes them) and an assistant's refusal parts,
joined by newlines as vLLM joins them; an earlier turn's tool calls reach the template with
their arguments as an object where they are JSON or given as one, as vLLM gives them (templates
write them out with tojson), and its earlier thinking under each name templates read it by; a
prefilled final message can be continued."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferlab.errors import InvalidParameterError
from inferlab.models.tokenizer import TextTokenizer

# what the template gets from the call itself and the tokenizer's BOS and EOS, never from
# chat_template_kwargs; they may set any other name, the other special tokens included (as
# transformers lets them), since they reach the template as one mapping
TEMPLATE_VARIABLES = {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"}
# a message's thinking, under any of these names, reaches the template under the first two
# (Qwen3's templates read reasoning_content, gpt-oss's thinking), as transformers passes it
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# written after a prefilled final message's content, to find where the template put its end; its
# space goes where a template trims the content's end
_CONTINUE_MARK = "INFERLAB_CONTINUE_FINAL_MESSAGE "


class ChatError(InvalidParameterError):
    """A conversation the template cannot take; `param` says where ("messages.0.content")."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def chat_prompt_text(tokenizer: TextTokenizer, messages: Sequence[Mapping[str, Any]],
                     add_generation_prompt: bool = True, continue_final_message: bool = False,
                     template: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None,
                     check_fits: Callable[[int], None] | None = None) -> str:
    """template: instead of the model's; template_kwargs: more variables for it; tools: its
    `tools`; check_fits: refuses a number of characters the context cannot hold
    (LLMEngine.check_text_fits), called with the messages' before rendering."""
    if not messages:
        raise ChatError("'messages' must not be empty", "messages")
    taken = sorted(set(template_kwargs or ()) & TEMPLATE_VARIABLES)
    if taken:
        raise ChatError(f"chat_template_kwargs cannot set {', '.join(taken)}: the request's own "
                        "fields do", "chat_template_kwargs")
    if continue_final_message and add_generation_prompt:
        raise ChatError("'continue_final_message' needs 'add_generation_prompt': false",
                        "continue_final_message")
    plain = [template_message(m, i) for i, m in enumerate(messages)]
    if check_fits is not None:
        check_fits(sum(len(m["content"]) for m in plain))
    if continue_final_message:
        plain[-1]["content"] += _CONTINUE_MARK
    text = tokenizer.apply_chat_template(plain, add_generation_prompt=add_generation_prompt,
                                         template=template, tools=tools, variables=template_kwargs)
    return _open_final_message(text) if continue_final_message else text


def template_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A message as chat templates read it."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ChatError("a message is an object with a 'role'", f"messages.{index}")
    out: dict[str, Any] = {"role": message["role"], "content": message_text(message, index)}
    out.update((key, message[key]) for key in ("name", "tool_call_id", *REASONING_FIELDS)
               if message.get(key) is not None)
    reasoning = next((out[key] for key in REASONING_FIELDS if key in out), None)
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise ChatError("a message's reasoning is text", f"messages.{index}")
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    if message.get("tool_calls"):
        out["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _json_or_text(
            call["function"].get("arguments", ""))}} for call in message["tool_calls"]]
    return out


def message_text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    parts = content if isinstance(content, list) else [content]
    return "\n".join(_part_text(part, message.get("role"), index) for part in parts)


def _part_text(part: Any, role: Any, index: int) -> str:
    """A content part's text: a 'text' part's, or an assistant's 'refusal' part's (OpenAI's
    assistant content parts; vLLM renders the refusal as the text); a bare string is a text
    part, as vLLM's chat_utils reads one."""
    if isinstance(part, str):
        return part
    param = f"messages.{index}.content"
    if not isinstance(part, Mapping) or "type" not in part:
        raise ChatError(f"a content part is an object with a 'type' ('text'), got {part!r}", param)
    kind = part["type"]
    if kind not in ("text", "refusal") or (kind == "refusal" and role != "assistant"):
        raise ChatError(f"content part type {kind!r} is not supported (only 'text' parts, and "
                        "'refusal' parts in an assistant's message)", param)
    if not isinstance(part.get(kind), str):
        raise ChatError(f"a {kind!r} content part needs a {kind!r} string", param)
    return part[kind]


def _json_or_text(arguments: Any) -> Any:
    """Arguments as the template gets them: an object where they are JSON text, {} where empty
    (as vLLM gives them), else the text; arguments already an object (transformers' documented
    form, LLM.chat's callers give it) as they are, as vLLM keeps them."""
    if not arguments:
        return {}
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _open_final_message(text: str) -> str:
    """The rendered chat cut where the final message's content ends (its mark), so that the model
    goes on with it (a prefilled reply), as transformers' continue_final_message cuts it. Looking
    for the content itself found it in the turn's end marker ("d" in "<|im_end|>"); a template
    that trims the content's end took the mark's space, and the content's own trailing space."""
    at = text.rfind(_CONTINUE_MARK.rstrip())
    if at < 0:
        raise ChatError("the chat template does not write the final message's content, so it "
                        "cannot be continued", "continue_final_message")
    return text[:at] if text.startswith(_CONTINUE_MARK, at) else text[:at].rstrip()

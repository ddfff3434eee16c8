"""Tool calls read out of a reply's text as it streams in, one parser per choice.

Each parser is fed the reply's text deltas and says, for each, what the client gets: plain
content and pieces of tool calls. A whole reply is the same parser fed the whole text once, so
a streamed reply and a whole one always agree. Four readings, as vLLM names them:
- NamedCall: tool_choice names a function; the reply is its arguments (a JSON object the
  guide held to the function's `parameters`), streamed as they come.
- RequiredCalls: tool_choice "required"; the reply is a JSON array of {"name", "parameters"}
  objects (held to the tools' schemas); a call goes out once its name is read, then its
  arguments as they come.
- HermesCalls (--tool-call-parser hermes): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` blocks in free text; text outside them is content.
- Llama3JsonCalls (--tool-call-parser llama3_json): a reply that opens with `{` (or Llama 3's
  `<|python_tag|>`) is one or more {"name", "parameters"} objects, separated by `;`; any other
  reply is content.
- MistralCalls (--tool-call-parser mistral): content, then `[TOOL_CALLS]` and a JSON array of
  {"name", "arguments"} objects.
A block or object that does not read as a call goes out as content, word for word: nothing the
model wrote is lost.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from inferlab.server.json_scan import ObjectEnds, json_string


@dataclass
class CallDelta:
    index: int  # which call of the reply (0, 1, ...)
    name: str | None  # given once, in the call's first delta
    arguments: str  # more of the arguments' JSON text


@dataclass
class ParsedDelta:
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class ToolParser(ABC):
    """feed() text deltas, then finish() once; both return what goes out now."""

    markers: tuple[str, ...] = ()  # texts the parser looks for (special tokens must be decoded)
    reports_calls = True  # a reply with calls finishes with "tool_calls" (not a named call)

    def __init__(self) -> None:
        self.num_calls = 0

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """What goes out of `text` now (a marker's possible start may be held back)."""

    def finish(self) -> ParsedDelta:
        return ParsedDelta()

    def _call(self, out: ParsedDelta, name: str, arguments: Any) -> None:
        out.calls.append(CallDelta(self.num_calls, name, json.dumps(arguments, ensure_ascii=False)))
        self.num_calls += 1


class NamedCall(ToolParser):
    reports_calls = False  # OpenAI finishes a forced call with "stop", as any reply

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> ParsedDelta:
        if not text:
            return ParsedDelta()
        first = self.num_calls == 0
        self.num_calls = 1
        return ParsedDelta(calls=[CallDelta(0, self.name if first else None, text)])

    def finish(self) -> ParsedDelta:
        if self.num_calls:
            return ParsedDelta()
        self.num_calls = 1  # an empty reply (max_tokens 0) is still the named call
        return ParsedDelta(calls=[CallDelta(0, self.name, "")])


def _object(text: str, keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """(name, arguments) of a call's JSON text, the arguments under the first of `keys` it has;
    None when it is not such an object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in keys if k in value), None)
    if key is None or not isinstance(value[key], dict):
        return None
    return value["name"], value[key]


class RequiredCalls(ToolParser):
    """A JSON array of calls, each under `arguments_key`. The guide holds each object to a call
    of a given tool, so a call goes out once its name is read, and its arguments' text as it
    comes (vLLM streams them so too)."""

    arguments_key = "parameters"
    streams_arguments = True  # False: each call goes out whole when its object closes

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.ends = ObjectEnds(level=1)
        self.used = 0  # characters of text gone out (as calls)
        self.sent: int | None = None  # the open call's argument characters gone out (None: unnamed)
        self.wrote_content = False  # an object that was not a call went out as content

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        start, self.text = len(self.text), self.text + text
        for begin, end in self.ends.scan(self.text, start):
            if self.streams_arguments and self._stream(out):
                self.sent = None
            elif (call := _object(self.text[begin:end], (self.arguments_key,))) is None:
                out.content += self.text[self.used:end]
                self.wrote_content = True
            else:
                self._call(out, *call)
            self.used = end
        if self.streams_arguments and self.ends.start is not None:
            self._stream(out)
        return out

    def _stream(self, out: ParsedDelta) -> bool:
        """What is new of the open object's call, once its name is read; False before that."""
        fields = self.ends.fields
        name, arguments = fields.get("name"), fields.get(self.arguments_key)
        if self.sent is None:
            called = None if name is None or name[1] is None else json_string(self.text[name[0]:name[1]])
            if called is None:
                return False
            out.calls.append(CallDelta(self.num_calls, called, ""))
            self.num_calls += 1
            self.sent = 0
        if arguments is not None:
            start, end = arguments[0] + self.sent, arguments[1] or len(self.text)
            if end > start:
                if not out.calls or out.calls[-1].index != self.num_calls - 1:
                    out.calls.append(CallDelta(self.num_calls - 1, None, ""))
                out.calls[-1].arguments += self.text[start:end]
                self.sent += end - start
        return True

    def finish(self) -> ParsedDelta:
        end = self.ends.array_end
        if end is not None:  # what follows the array is content, unless blank (and its closing
            rest = self.text[self.used if self.wrote_content else end:]  # bracket, if some was)
            return ParsedDelta(content=rest if rest.strip() else "")
        # an array cut short (max_tokens): what did not become a call goes out as it is
        rest = self.text[self.used:self.ends.start if self.sent is not None else None]
        return ParsedDelta(content=rest if rest.strip(" \t\r\n,") else "")


class _MistralArray(RequiredCalls):
    arguments_key = "arguments"
    streams_arguments = False  # unguided: an object may turn out not to be a call


class MistralCalls(ToolParser):
    """Mistral's: content, then `[TOOL_CALLS]` and a JSON array of {"name", "arguments"}."""

    TAG = "[TOOL_CALLS]"
    markers = (TAG,)

    def __init__(self) -> None:
        super().__init__()
        self.pending = ""  # text that may be the start of the tag
        self.array: _MistralArray | None = None

    def feed(self, text: str) -> ParsedDelta:
        if self.array is not None:
            return self._read(self.array.feed(text))
        self.pending += text
        at = self.pending.find(self.TAG)
        if at < 0:
            passed, self.pending = held_back(self.pending, self.TAG)
            return ParsedDelta(content=passed)
        before, rest = self.pending[:at], self.pending[at + len(self.TAG):]
        self.pending, self.array = "", _MistralArray()
        out = self._read(self.array.feed(rest))
        out.content = before + out.content
        return out

    def finish(self) -> ParsedDelta:
        if self.array is None:
            out, self.pending = ParsedDelta(content=self.pending), ""
            return out
        return self._read(self.array.finish())

    def _read(self, out: ParsedDelta) -> ParsedDelta:
        assert self.array is not None
        self.num_calls = self.array.num_calls
        return out


def held_back(text: str, marker: str) -> tuple[str, str]:
    """(the text that can go out, its tail that may be the start of marker: held until the next
    text settles it)."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return text[:-keep], text[-keep:]
    return text, ""


class HermesCalls(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    markers = (OPEN, CLOSE)

    def __init__(self) -> None:
        super().__init__()
        self.pending = ""  # text not yet settled: a possible marker's start, or an open block
        self.in_call = False
        self.blank = ""  # whitespace after a call, shown only if more content follows

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self.pending += text
        while True:
            marker = self.CLOSE if self.in_call else self.OPEN
            at = self.pending.find(marker)
            if at < 0:
                break
            if self.in_call:
                self._block(out, self.pending[:at])
            else:
                self._content(out, self.pending[:at])
            self.pending, self.in_call = self.pending[at + len(marker):], not self.in_call
        if not self.in_call:
            passed, self.pending = held_back(self.pending, self.OPEN)
            self._content(out, passed)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self.in_call:  # a block left open at the end is read as if closed, as vLLM reads it
            self._block(out, self.pending, closed=False)
        else:
            self._content(out, self.pending)
        self.pending = ""
        return out

    def _block(self, out: ParsedDelta, body: str, closed: bool = True) -> None:
        call = _object(body.strip(), ("arguments",))
        if call is None:
            self._content(out, self.OPEN + body + (self.CLOSE if closed else ""))
        else:
            self.blank = ""
            self._call(out, *call)

    def _content(self, out: ParsedDelta, text: str) -> None:
        if self.num_calls and not (self.blank + text).strip():
            self.blank += text  # the newlines between and after calls are not content
            return
        out.content += self.blank + text
        self.blank = ""


_SEPARATORS = " \t\r\n;"  # what may stand between llama3_json calls


class Llama3JsonCalls(ToolParser):
    TAG = "<|python_tag|>"
    markers = (TAG,)

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.mode: str | None = None  # "calls" or "content", decided by how the reply opens
        self.ends = ObjectEnds(level=0)
        self.used = 0  # characters of text gone out
        self.scanned = 0  # characters of text the object scan has read

    def feed(self, text: str) -> ParsedDelta:
        self.text += text
        if self.mode is None:
            self.mode = self._opening()
            head = len(self.text) - len(self.text.lstrip())
            if self.mode == "calls" and self.text.startswith(self.TAG, head):
                self.used = self.scanned = head + len(self.TAG)
        if self.mode == "content":
            out, self.used = ParsedDelta(content=self.text[self.used:]), len(self.text)
            return out
        return self._calls() if self.mode == "calls" else ParsedDelta()

    def finish(self) -> ParsedDelta:
        if self.mode is None:
            self.mode = "content"
        out = self._calls() if self.mode == "calls" else ParsedDelta()
        rest, self.used = self.text[self.used:], len(self.text)
        if self.mode == "content" or rest.strip(_SEPARATORS):  # not the space after the calls
            out.content += rest
        return out

    def _opening(self) -> str | None:
        head = self.text.lstrip()
        if head.startswith("{") or head.startswith(self.TAG):
            return "calls"
        return None if head == "" or self.TAG.startswith(head) else "content"

    def _calls(self) -> ParsedDelta:
        out = ParsedDelta()
        start, self.scanned = self.scanned, len(self.text)
        for begin, end in self.ends.scan(self.text, start):
            gap = self.text[self.used:begin]
            if gap.strip(_SEPARATORS):
                out.content += gap
            call = _object(self.text[begin:end], ("parameters", "arguments"))
            if call is None:
                out.content += self.text[begin:end]
            else:
                self._call(out, *call)
            self.used = end
        return out


AUTO_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesCalls, "llama3_json": Llama3JsonCalls, "mistral": MistralCalls}

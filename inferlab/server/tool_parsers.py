"""Tool calls read out of a reply's text as it streams in, one parser per choice.

Each parser is fed the reply's text deltas and says, for each, what the client gets: plain
content and pieces of tool calls. A whole reply is the same parser fed the whole text once, so
a streamed reply and a whole one always agree. Two readings of guided replies are here, as vLLM
names them; the formats models write by themselves (--tool-call-parser) are in
tool_call_formats.py:
- NamedCall: tool_choice names a function; the reply is its arguments (a JSON object the
  guide held to the function's `parameters`), streamed as they come.
- RequiredCalls: tool_choice "required"; the reply is a JSON array of {"name", "parameters"}
  objects (held to the tools' schemas); a call goes out once its name is read, then its
  arguments as they come.
Every call streams (CallObjects): it goes out once it reads as one, then its arguments' text as
the model writes it. A block or object that never reads as a call goes out as content, word for
word: nothing the model wrote is lost.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

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
    forced = False  # the calls are held to the tools' schemas by a guide (named, "required")

    def __init__(self) -> None:
        self.num_calls = 0

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """What goes out of `text` now (a marker's possible start may be held back)."""

    def finish(self) -> ParsedDelta:
        return ParsedDelta()

    @property
    def cut_short(self) -> bool:
        """Whether a forced reply ended before vLLM could read its calls (read after finish)."""
        return False


class NamedCall(ToolParser):
    reports_calls = False  # OpenAI finishes a forced call with "stop", as any reply
    forced = True

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


class CallObjects:
    """Calls in the JSON objects at one nesting level of a text as it arrives (ObjectEnds). The
    open object's call goes out once it reads as one: its name read and, unless `sure`, its
    arguments (under the first of `keys` to come) opened as an object. Then its arguments' text
    goes out as the model writes it, as vLLM streams it; a key's later values are passed over."""

    def __init__(self, level: int, keys: tuple[str, ...], sure: bool) -> None:
        self.ends = ObjectEnds(level)
        self.keys, self.sure = keys, sure
        self.text = ""
        self.sent: int | None = None  # the open call's argument characters gone out (None: unnamed)

    def feed(self, parser: ToolParser, out: ParsedDelta, text: str) -> list[tuple[int, int, bool]]:
        """Adds text, puts what is new of the calls in out, and returns the objects it closed:
        (begin, end, whether it was a call)."""
        start, self.text = len(self.text), self.text + text
        closed = []
        for begin, end in self.ends.scan(self.text, start):
            closed.append((begin, end, self._stream(parser, out)))
            self.sent = None
        if self.ends.start is not None:
            self._stream(parser, out)
        return closed

    @property
    def in_call(self) -> bool:
        """Whether the open object has gone out as a call."""
        return self.ends.start is not None and self.sent is not None

    def _stream(self, parser: ToolParser, out: ParsedDelta) -> bool:
        """What is new of the open object's call; False while it does not read as one."""
        fields = self.ends.fields
        name = fields.get("name")
        arguments = min((fields[k] for k in self.keys if k in fields), default=None,
                        key=lambda span: span[0])  # whichever came first stays first
        if self.sent is None:
            called = None if name is None or name[1] is None else json_string(self.text[name[0]:name[1]])
            opened = arguments is not None and self.text[arguments[0]] == "{"
            if called is None or not (self.sure or opened):
                return False
            out.calls.append(CallDelta(parser.num_calls, called, ""))
            parser.num_calls += 1
            self.sent = 0
        if arguments is not None:
            start, end = arguments[0] + self.sent, arguments[1] or len(self.text)
            if end > start:
                if not out.calls or out.calls[-1].index != parser.num_calls - 1:
                    out.calls.append(CallDelta(parser.num_calls - 1, None, ""))
                out.calls[-1].arguments += self.text[start:end]
                self.sent += end - start
        return True


class RequiredCalls(ToolParser):
    """A JSON array of calls, each under `arguments_key`. The guide holds each object to a call
    of a given tool, so a call goes out once its name is read."""

    arguments_key = "parameters"
    guided = True  # False: an object must open its arguments as well to read as a call
    forced = True
    lead = ""  # text before the array (Mistral's tag): content along with the array's start,
    # when that is content (no call came before it)

    def __init__(self) -> None:
        super().__init__()
        self.objects = CallObjects(level=1, keys=(self.arguments_key,), sure=self.guided)
        self.used = 0  # characters of text gone out (as calls or content)
        self.wrote_content = False  # an object that was not a call went out as content

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        for _, end, called in self.objects.feed(self, out, text):
            if not called:
                out.content += self._text(self.used, end)
                self.wrote_content = True
            self.used = end
        return out

    def finish(self) -> ParsedDelta:
        text, end = self.objects.text, self.objects.ends.array_end
        if end is not None:  # what follows the array is content, unless blank (and its closing
            # bracket, if some was; all of it, if no call came of an unguided array)
            kept = self.wrote_content or not (self.guided or self.num_calls)
            rest = self._text(self.used if kept else end, None)
            return ParsedDelta(content=rest if rest.strip() else "")
        # an array cut short (max_tokens): what did not become a call goes out as it is, but
        # not the opening bracket of an array with a call; under the guide all of it is the
        # calls' framing, as vLLM reads a required call's reply
        if self.guided:
            return ParsedDelta()
        start = self.used or (text.find("[") + 1 if self.num_calls else 0)
        rest = self._text(start, self.objects.ends.start if self.objects.in_call else None)
        return ParsedDelta(content=rest if rest.strip(" \t\r\n,") else "")

    @property
    def cut_short(self) -> bool:
        # vLLM validates the whole array at once: one never closed gives no calls, even those
        # complete in it (the stream has sent them as they came)
        return self.objects.ends.array_end is None

    def _text(self, begin: int, end: int | None) -> str:
        """The array's text from begin to end as content: from its start, after the lead."""
        return (self.lead if begin == 0 else "") + self.objects.text[begin:end]


def held_back(text: str, marker: str) -> tuple[str, str]:
    """(the text that can go out, its tail that may be the start of marker: held until the next
    text settles it)."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return text[:-keep], text[-keep:]
    return text, ""

"""Tool calls read out of a reply's text as it streams in, one parser per choice.

Each parser is fed the reply's text deltas and says, for each, what the client gets: plain
content and pieces of tool calls. A whole reply is the same parser fed the whole text once, so
a streamed reply and a whole one always agree. Five readings, as vLLM names them:
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
  {"name", "arguments"} objects; or, from Mistral's v11 tokenizers on, `[TOOL_CALLS]name[ARGS]`
  and the arguments object, once per call.
Every call streams (CallObjects): it goes out once it reads as one, then its arguments' text as
the model writes it. A block or object that never reads as a call goes out as content, word for
word: nothing the model wrote is lost.
"""

from __future__ import annotations

import re
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

    def __init__(self) -> None:
        self.num_calls = 0

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """What goes out of `text` now (a marker's possible start may be held back)."""

    def finish(self) -> ParsedDelta:
        return ParsedDelta()


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

    def __init__(self) -> None:
        super().__init__()
        self.objects = CallObjects(level=1, keys=(self.arguments_key,), sure=self.guided)
        self.used = 0  # characters of text gone out (as calls or content)
        self.wrote_content = False  # an object that was not a call went out as content

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        for _, end, called in self.objects.feed(self, out, text):
            if not called:
                out.content += self.objects.text[self.used:end]
                self.wrote_content = True
            self.used = end
        return out

    def finish(self) -> ParsedDelta:
        text, end = self.objects.text, self.objects.ends.array_end
        if end is not None:  # what follows the array is content, unless blank (and its closing
            # bracket, if some was; all of it, if no call came of an unguided array)
            kept = self.wrote_content or not (self.guided or self.num_calls)
            rest = text[self.used if kept else end:]
            return ParsedDelta(content=rest if rest.strip() else "")
        # an array cut short (max_tokens): what did not become a call goes out as it is, but
        # not the array's opening bracket; under the guide all of it is the calls' framing, as
        # vLLM reads a required call's reply
        if self.guided:
            return ParsedDelta()
        start = self.used or text.find("[") + 1
        rest = text[start:self.objects.ends.start if self.objects.in_call else None]
        return ParsedDelta(content=rest if rest.strip(" \t\r\n,") else "")


class _MistralArray(RequiredCalls):
    arguments_key = "arguments"
    guided = False


class MistralCalls(ToolParser):
    """Mistral's two forms: content, then `[TOOL_CALLS]` and a JSON array of {"name",
    "arguments"} (tokenizers before v11); or each call as `[TOOL_CALLS]name[ARGS]{...}`, v13's
    with `[CALL_ID]id` before `[ARGS]` (v11 on). In the second, text after a call that is not
    the next call's tag is content (blank text only if more content follows)."""

    TAG, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    markers = (TAG, ARGS, CALL_ID)
    _HEADER = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\]\w*)?(?:\[ARGS\])?\s*")  # before the "{"
    _HEADER_CHARS = re.compile(r"\s*[\w.\-\[\]]*\s*")  # what can still become a header

    def __init__(self) -> None:
        super().__init__()
        self.pending = ""  # text not yet gone out: a tag's possible start, a header, blank text
        self.state = "content"  # or "tag" (just read one), "header", "arguments"
        self.array: _MistralArray | None = None  # the pre-v11 form, to the end of the reply
        self.arguments = ObjectEnds(0)  # where the open call's arguments object closes
        self.arguments_text = ""  # that object's text so far
        self.after_call = False  # no content since the last call: blank text is held

    def feed(self, text: str) -> ParsedDelta:
        if self.array is not None:
            return self._read(self.array.feed(text))
        out, self.pending = ParsedDelta(), self.pending + text
        while self._step(out):
            pass
        return out

    def finish(self) -> ParsedDelta:
        if self.array is not None:
            return self._read(self.array.finish())
        out = ParsedDelta()
        if self.state in ("content", "header"):  # a header cut short goes out as what it was
            self._content(out, self.pending)
        self.pending = ""
        return out

    def _step(self, out: ParsedDelta) -> bool:
        """Reads what it can of the pending text; whether the state moved on."""
        if self.state == "content":
            at = self.pending.find(self.TAG)
            if at < 0:
                passed, held = held_back(self.pending, self.TAG)
                if self._content(out, passed):
                    self.pending = held
                return False
            self._content(out, self.pending[:at])  # blank text between calls is dropped
            self.pending, self.state = self.pending[at + len(self.TAG):], "tag"
            return True
        if self.state == "tag":
            opening = self.pending.lstrip()
            if not opening:
                return False
            if opening.startswith("[") and not self.num_calls:
                self.array, rest, self.pending = _MistralArray(), self.pending, ""
                read = self._read(self.array.feed(rest))
                out.content += read.content
                out.calls += read.calls
                return False
            self.state = "header"
            return True
        if self.state == "header":
            return self._header(out)
        return self._arguments(out)

    def _content(self, out: ParsedDelta, text: str) -> bool:
        """Puts text out as content, unless blank right after a call (held until more content
        shows it is some); whether it went out."""
        if self.after_call and not text.strip():
            return False
        out.content += text
        self.after_call = False
        return True

    def _header(self, out: ParsedDelta) -> bool:
        brace = self.pending.find("{")
        header = self.pending if brace < 0 else self.pending[:brace]
        if brace < 0 and self._HEADER_CHARS.fullmatch(header):
            return False  # may still become one
        match = self._HEADER.fullmatch(header) if brace >= 0 else None
        if match is None:  # no call: the text goes out as content
            self.state = "content"
            return True
        out.calls.append(CallDelta(self.num_calls, match.group(1), ""))
        self.num_calls += 1
        self.pending, self.state = self.pending[brace:], "arguments"
        self.arguments, self.arguments_text = ObjectEnds(0), ""
        return True

    def _arguments(self, out: ParsedDelta) -> bool:
        start = len(self.arguments_text)
        self.arguments_text += self.pending
        end = next((end for _, end in self.arguments.scan(self.arguments_text, start)), None)
        taken = len(self.pending) if end is None else end - start
        if taken:
            out.calls.append(CallDelta(self.num_calls - 1, None, self.pending[:taken]))
        self.pending = self.pending[taken:]
        if end is None:
            return False
        self.state, self.after_call = "content", True
        return True

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
        self.pending = ""  # text that may be the start of a marker, held until the next settles it
        self.block: CallObjects | None = None  # the open block's objects
        self.closed: list[tuple[int, int, bool]] = []  # the objects closed in the open block
        self.blank = ""  # whitespace after a call, shown only if more content follows

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self.pending += text
        while (at := self.pending.find(self.CLOSE if self.block else self.OPEN)) >= 0:
            body = self.pending[:at]
            self.pending = self.pending[at + len(self.CLOSE if self.block else self.OPEN):]
            if self.block is None:
                self._content(out, body)
                self.block, self.closed = CallObjects(level=0, keys=("arguments",), sure=False), []
            elif self._inside_a_string(out, body):  # the tag is text the call's JSON holds
                self.closed += self.block.feed(self, out, self.CLOSE)
            else:
                self._end_block(out, "", self.CLOSE)
        passed, self.pending = held_back(self.pending, self.CLOSE if self.block else self.OPEN)
        if self.block is None:
            self._content(out, passed)
        else:
            self.closed += self.block.feed(self, out, passed)
        return out

    def finish(self) -> ParsedDelta:
        out, rest, self.pending = ParsedDelta(), self.pending, ""
        if self.block is None:
            self._content(out, rest)
        else:  # a block left open at the end is read as if closed, as vLLM reads it; text held
            # back after its objects can only be the start of its closing tag, cut short
            tail = rest if self.block.ends.start is None else ""
            self._end_block(out, rest[:len(rest) - len(tail)], tail)
        return out

    def _inside_a_string(self, out: ParsedDelta, body: str) -> bool:
        """Reads the block's text up to a closing tag: whether the tag sits inside a string of
        an object ('{"q": "</tool_call>"}' closes no block)."""
        assert self.block is not None
        self.closed += self.block.feed(self, out, body)
        return self.block.ends.in_string and self.block.ends.start is not None

    def _end_block(self, out: ParsedDelta, body: str, close: str) -> None:
        """A block with no call goes out as content word for word (close: its closing tag as
        written); in one with calls, the text outside them goes out as content unless it is
        blank."""
        assert self.block is not None
        block, self.block = self.block, None
        spans = self.closed + block.feed(self, out, body)
        calls = [(b, e) for b, e, called in spans if called]
        if block.in_call:  # cut short by the end of the block
            calls.append((block.ends.start, len(block.text)))
        if not calls:
            self._content(out, self.OPEN + block.text + close)
            return
        cuts = [0, *(at for span in calls for at in span), len(block.text)]
        outside = "".join(block.text[cuts[i]:cuts[i + 1]] for i in range(0, len(cuts), 2))
        self.blank = ""
        if outside.strip():
            self._content(out, outside)

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
        self.head = ""  # the reply's opening, until it tells calls from content
        self.mode: str | None = None  # "calls" or "content", decided by how the reply opens
        self.objects = CallObjects(level=0, keys=("parameters", "arguments"), sure=False)
        self.used = 0  # characters of the objects' text gone out

    def feed(self, text: str) -> ParsedDelta:
        if self.mode is None:
            self.head += text
            self.mode = self._opening()
            if self.mode is None:
                return ParsedDelta()
            text, self.head = self.head, ""
            if self.mode == "calls" and text.lstrip().startswith(self.TAG):
                text = text.lstrip()[len(self.TAG):]
        if self.mode == "content":
            return ParsedDelta(content=text)
        out = ParsedDelta()
        for begin, end, called in self.objects.feed(self, out, text):
            self._rest(out, begin)
            if not called:
                out.content += self.objects.text[begin:end]
            self.used = end
        return out

    def finish(self) -> ParsedDelta:
        if self.mode is None:  # too short to tell
            self.mode = "content"
            return ParsedDelta(content=self.head)
        out = ParsedDelta()
        if self.mode == "calls":  # a call cut short (max_tokens) went out; other text is content
            self._rest(out, self.objects.ends.start if self.objects.in_call else None)
        return out

    def _rest(self, out: ParsedDelta, end: int | None) -> None:
        """The text from the last object to end goes out as content, unless only separators."""
        gap = self.objects.text[self.used:end]
        if gap.strip(_SEPARATORS):
            out.content += gap

    def _opening(self) -> str | None:
        head = self.head.lstrip()
        if head.startswith("{") or head.startswith(self.TAG):
            return "calls"
        return None if head == "" or self.TAG.startswith(head) else "content"


AUTO_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesCalls, "llama3_json": Llama3JsonCalls, "mistral": MistralCalls}

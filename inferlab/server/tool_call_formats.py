"""The tool-call formats models write by themselves, read out of free text as it streams in
(--tool-call-parser; the contract and the guided readings are in tool_parsers.py):
- HermesCalls (hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in
  free text; text outside them is content.
- Llama3JsonCalls (llama3_json): a reply that opens with `{` (or Llama 3's `<|python_tag|>`) is
  one or more {"name", "parameters"} objects, separated by `;`; any other reply is content.
- MistralCalls (mistral): content, then `[TOOL_CALLS]` and a JSON array of {"name", "arguments"}
  objects; or, from Mistral's v11 tokenizers on, `[TOOL_CALLS]name[ARGS]` and the arguments
  object, once per call.
"""

from __future__ import annotations

import re

from inferlab.server.json_scan import ObjectEnds
from inferlab.server.tool_parsers import (
    CallDelta,
    CallObjects,
    ParsedDelta,
    RequiredCalls,
    ToolParser,
    held_back,
)

_MISTRAL_TAG = "[TOOL_CALLS]"


class _MistralArray(RequiredCalls):
    arguments_key = "arguments"
    guided = False
    lead = _MISTRAL_TAG  # an array that does not open with a call: the tag is content too


class MistralCalls(ToolParser):
    """Mistral's two forms: content, then `[TOOL_CALLS]` and a JSON array of {"name",
    "arguments"} (tokenizers before v11); or each call as `[TOOL_CALLS]name[ARGS]{...}`, v13's
    with `[CALL_ID]id` before `[ARGS]` (v11 on). In the second, text after a call that is not
    the next call's tag is content (blank text only if more content follows). A tag that no
    call follows is content, with what follows it, as vLLM gives a reply it cannot read."""

    TAG, ARGS, CALL_ID = _MISTRAL_TAG, "[ARGS]", "[CALL_ID]"
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
        stepping = True
        while stepping:  # each step reads what it can, until one cannot move on
            stepping = self._step(out)
        return out

    def finish(self) -> ParsedDelta:
        if self.array is not None:
            return self._read(self.array.finish())
        out = ParsedDelta()
        if self.state == "content":
            self._content(out, self.pending)
        elif self.state in ("tag", "header"):  # a tag, or a header cut short: what it was
            self._content(out, self.TAG + self.pending)
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
        if match is None:  # no call: the tag and the text go out as content
            self._content(out, self.TAG)
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

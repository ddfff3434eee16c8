"""One chat choice's text read as the client gets it: thinking (with --reasoning-parser),
content, and tool calls (with tools), delta by delta, in the shapes OpenAI streams them; the
whole reply is the same reading of the whole text."""

from __future__ import annotations

import json
import uuid
from typing import Any

from inferlab.server.protocol import FunctionCall, ToolCall
from inferlab.server.reasoning import ReasoningParser, Split
from inferlab.server.tool_parsers import ParsedDelta, ToolParser


class ReplyReader:
    def __init__(self, tools: ToolParser | None, reasoning: ReasoningParser | None,
                 show_reasoning: bool = True, parallel_calls: bool = True) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self.show_reasoning = show_reasoning  # vLLM's include_reasoning
        self.parallel_calls = parallel_calls  # False: the first call only, as vLLM filters them
        self.thought = False  # some of the reply was thinking, shown or not
        self.names: list[str] = []
        self.arguments: list[str] = []
        self.ids: list[str] = []
        self.text = ""  # the reply after its thinking: what the tool parser read

    def read(self, text: str, finished: bool) -> tuple[str, ParsedDelta]:
        """(the new reasoning, the new content and pieces of calls)."""
        split = self.reasoning.feed(text, finished) if self.reasoning else Split(content=text)
        self.thought = self.thought or bool(split.reasoning)
        reasoning = split.reasoning if self.show_reasoning else ""
        self.text += split.content
        if self.tools is None:
            return reasoning, ParsedDelta(content=split.content)
        out = self.tools.feed(split.content)
        if finished:
            rest = self.tools.finish()
            out.content += rest.content
            out.calls += rest.calls
        if not self.parallel_calls:
            out.calls = [call for call in out.calls if call.index == 0]
        for call in out.calls:
            if call.name is not None:
                self.names.append(call.name)
                self.arguments.append("")
                self.ids.append(f"chatcmpl-tool-{uuid.uuid4().hex}")
            self.arguments[call.index] += call.arguments
        return reasoning, out

    def delta(self, reasoning: str, parsed: ParsedDelta) -> dict[str, Any]:
        """A stream chunk's delta: the new reasoning and content and pieces of calls, a call's
        id, type and name in its first piece only."""
        # both names, as ReplyMessage has them
        out: dict[str, Any] = {"reasoning": reasoning, "reasoning_content": reasoning} if reasoning else {}
        if parsed.content:
            out["content"] = parsed.content
        if parsed.calls:
            out["tool_calls"] = [
                {"index": c.index, "function": {"arguments": c.arguments}} if c.name is None else
                {"index": c.index, "id": self.ids[c.index], "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.calls]
        return out

    def calls_unreadable(self) -> bool:
        """Whether vLLM reads no calls of the whole reply: one cut short by max_tokens in the
        middle of a call the model wrote unforced (arguments that are no JSON), or of a required
        call's array (vLLM validates the array as a whole)."""
        if self.tools is None:
            return False
        if self.tools.forced:
            return self.tools.cut_short
        try:
            for arguments in self.arguments:
                json.loads(arguments)
        except ValueError:
            return True
        return False

    def drop_calls(self) -> str:
        """No calls, and the content vLLM gives a whole reply whose calls it cannot read: the
        reply's text from a tool parser, none for a forced reply (it was all calls). Returns it."""
        self.names, self.arguments, self.ids = [], [], []
        return "" if self.tools is not None and self.tools.forced else self.text

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(id=i, function=FunctionCall(name=n, arguments=a))
                for i, n, a in zip(self.ids, self.names, self.arguments, strict=True)]

    def finish_reason(self, reason: str | None) -> str | None:
        """"tool_calls" for a reply that ended by itself with calls the model chose to make."""
        chose = self.tools is not None and self.tools.reports_calls and self.names
        return "tool_calls" if chose and reason == "stop" else reason

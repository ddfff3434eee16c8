"""A reasoning model's thinking split from its answer, as vLLM's --reasoning-parser splits it:
the thinking goes out as `reasoning` (and `reasoning_content`, its older name), the rest as `content` (where tool calls, if
any, are then read).

- deepseek_r1: DeepSeek-R1 and its distills (Llama ones among them). Their chat template opens
  the thinking in the prompt, so the reply starts inside it: everything up to `</think>` is
  reasoning (a `<think>` the model writes itself, wherever it comes before `</think>`, is
  dropped, as vLLM's stream skips its token); a reply with no `</think>` is all reasoning.
- qwen3: Qwen3 and models that think in `<think>...</think>` only when asked: a reply that
  opens with `<think>` is reasoning up to `</think>`; any other reply is all content.

A guide (structured outputs, a forced tool call) holds the answer only: it starts after the
thinking (engine/guided/thinking_grammar.py), as vLLM's does; with qwen3, a reply that does not
open with `<think>` is held from its first character. The guide lets a little whitespace through
between `</think>` and the answer (the gap: the model's own habit); a guided parser drops it,
so that `content` is what the guide matched (see ReasoningParser.__init__).

A parser is fed the reply's text deltas and says, for each, what is reasoning and what is
content; text that may be the start of a marker is held until the next text settles it, so a
stream and a whole reply split alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.engine.guided.thinking_grammar import MAX_GAP, gap_length
from inferlab.models.tokenizer import TextTokenizer
from inferlab.server.tool_parsers import held_back

OPEN, CLOSE = "<think>", "</think>"


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    markers = (OPEN, CLOSE)
    # deepseek_r1: the prompt opened the thinking, so a `<think>` the model writes before
    # `</think>` opens nothing and is dropped
    starts_inside = True
    # (opener, closer) a guide (structured outputs) starts after: opener None, the reply starts
    # inside the thinking
    guide_markers: tuple[str | None, str] = (None, CLOSE)

    def __init__(self, guided: bool = False) -> None:
        """guided: the request has a guide (held after the thinking,
        engine/guided/thinking_grammar.py). Its gap after `</think>` is dropped; an unguided reply
        keeps it, as vLLM's parsers keep what follows `</think>` whole. Under vLLM's guide the
        answer starts right at `</think>`, so the guided content vLLM gives holds no gap either; and
        the models' templates do not take it for the answer (Qwen3's renders a past answer as
        `content.split('</think>')[-1].lstrip('\\n')`)."""
        self.pending = ""  # text not yet settled
        self.state = "opening"  # "opening" (has the reply opened with <think>?), "thinking", "answer"
        self.guided = guided
        self.gap_left = 0  # characters of the gap that may still come, and be dropped

    def feed(self, text: str, finished: bool = False) -> Split:
        out = Split()
        self.pending += text
        if self.state == "opening":
            self._open(finished)
        if self.state == "thinking":
            at = self.pending.find(CLOSE)
            if at >= 0:
                out.reasoning, self.pending = self.pending[:at], self.pending[at + len(CLOSE):]
                self.state, self.gap_left = "answer", MAX_GAP if self.guided else 0
            else:
                out.reasoning, self.pending = ((self.pending, "") if finished else
                                               self._held_back_thinking(self.pending))
            if self.starts_inside:  # one pass, as a stream drops each <think> it settles
                out.reasoning = out.reasoning.replace(OPEN, "")
        if self.state == "answer":
            out.content, self.pending = out.content + self._after_gap(self.pending), ""
        return out

    def _held_back_thinking(self, text: str) -> tuple[str, str]:
        """held_back for the markers the thinking may hold: `</think>`, and `<think>` where it is
        dropped (held whole, so that a stream drops it as a whole reply does)."""
        markers = (CLOSE, OPEN) if self.starts_inside else (CLOSE,)
        return min((held_back(text, marker) for marker in markers), key=lambda split: len(split[0]))

    def _after_gap(self, text: str) -> str:
        """`text` without the gap's characters in it, the gap read across deltas as the guide
        reads it (thinking_grammar.gap_length): whitespace, up to MAX_GAP characters."""
        dropped = min(gap_length(text), self.gap_left)
        self.gap_left = 0 if len(text) > dropped else self.gap_left - dropped
        return text[dropped:]

    def _open(self, finished: bool) -> None:
        head = self.pending.lstrip()
        if head.startswith(OPEN):
            self.pending, self.state = head[len(OPEN):], "thinking"
        elif not finished and OPEN.startswith(head):
            return  # nothing yet, or the start of <think>: wait
        else:
            self.state = "thinking" if self.starts_inside else "answer"


class Qwen3Reasoning(ReasoningParser):
    starts_inside = False
    guide_markers = (OPEN, CLOSE)  # a reply that does not open with <think> is all answer


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": ReasoningParser, "qwen3": Qwen3Reasoning}


def split_markers(parser: type[ReasoningParser], tokenizer: TextTokenizer) -> list[str]:
    """The parser's markers the tokenizer has no single token for. A model trained to think has
    one for each (vLLM's parsers refuse to start without them); without one, a guide that
    reads the text character by character can let the model spell `<think>` out, a character
    at a time, and so think its way out of what the guide was to hold it to."""
    return [m for m in parser.markers if len(tokenizer.encode(m, add_special_tokens=False)) != 1]

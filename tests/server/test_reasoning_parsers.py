"""The reasoning parsers on hand-written replies: the thinking and the answer each must give,
whole and fed in pieces (every split in two, and a character at a time), which must agree."""

from __future__ import annotations

import pytest
from test_tool_parsers import splits

from inferlab.server.reasoning import Qwen3Reasoning, ReasoningParser


def read(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    outs = [parser.feed(p, finished=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    return "".join(o.reasoning for o in outs), "".join(o.content for o in outs)


@pytest.mark.parametrize(("make", "reply", "reasoning", "content"), [
    # deepseek_r1: the prompt opened the thinking
    (ReasoningParser, "Two and two.\n</think>\n\nIt is 4.", "Two and two.\n", "\n\nIt is 4."),
    (ReasoningParser, "<think>\nHm, </thin or </think>4", "\nHm, </thin or ", "4"),
    (ReasoningParser, "Still thinking </thi", "Still thinking </thi", ""),  # cut short
    (ReasoningParser, "<thi", "<thi", ""),
    # a <think> the model writes opens nothing: dropped wherever it comes in the thinking ...
    (ReasoningParser, "pre<think>a</think>b", "prea", "b"),
    (ReasoningParser, "a <think>b<think>c", "a bc", ""),
    # ... but kept in the answer
    (ReasoningParser, "a</think>b<think>c", "a", "b<think>c"),
    # qwen3: only a reply that opens with <think> thinks
    (Qwen3Reasoning, "<think>a < b</think>Yes.", "a < b", "Yes."),
    (Qwen3Reasoning, "\n<think></think>\n\nYes.", "", "\n\nYes."),
    (Qwen3Reasoning, "Yes, </think> is a tag.", "", "Yes, </think> is a tag."),
    (Qwen3Reasoning, "<thin", "", "<thin"),
    (Qwen3Reasoning, "<think>a<think>b</think>c", "a<think>b", "c"),
])
def test_replies_split_as_read_by_hand_however_they_are_fed(make, reply, reasoning, content):
    for pieces in splits(reply):
        assert read(make(), pieces) == (reasoning, content), pieces


def test_thinking_goes_out_before_it_ends():
    parser = ReasoningParser()
    first = parser.feed("Let me see </")
    assert (first.reasoning, first.content) == ("Let me see ", "")  # "</" may open </think>
    second = parser.feed("b> no</think>Done")
    assert (second.reasoning, second.content) == ("</b> no", "Done")

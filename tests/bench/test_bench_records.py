"""Raw exchanges to records: which chunks are tokens, usage, and each request's outcome."""

from __future__ import annotations

import json

from inferlab.bench.client import RawExchange
from inferlab.bench.records import chunk_token_counts, parse_events, to_record
from inferlab.bench.templates import RequestTemplate

TEMPLATE = RequestTemplate(b"{", b"}", prompt_tokens=30, output_tokens=3)


def event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode()


def completion(text: str, finish: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def chat(delta: dict, finish: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 3}})
DONE = b"data: [DONE]"


def exchange(events: list[bytes], times: list[int], **fields: object) -> RawExchange:
    raw = RawExchange(index=4, template=0, intended_ns=1_000, start_ns=1_500, sent_ns=1_600,
                      headers_ns=2_000, end_ns=9_000, status=200)
    raw.events, raw.event_ns = events, times
    for key, value in fields.items():
        setattr(raw, key, value)
    return raw


def test_completion_stream_with_usage():
    raw = exchange([completion(" a"), completion(" b"), completion(" c", "length"), USAGE, DONE],
                   [3_000, 4_000, 6_000, 6_000, 6_000])
    record = to_record(raw, stage=2, worker=1, epoch_ns=1_000, template=TEMPLATE, counter=None)
    assert record.outcome == "ok" and record.error == ""
    assert (record.intended_ns, record.start_ns, record.end_ns) == (0, 500, 8_000)
    assert record.first_token_ns == 2_000
    assert record.chunk_ns == [2_000, 3_000, 5_000]
    assert record.chunk_tokens == [1, 1, 1]
    assert (record.output_tokens, record.output_tokens_source) == (3, "usage")
    assert (record.prompt_tokens, record.prompt_tokens_sent) == (31, 30)
    assert record.finish_reason == "length" and record.output_tokens_asked == 3


def test_chat_role_chunk_is_not_the_first_token():
    raw = exchange([chat({"role": "assistant", "content": ""}), chat({"content": "Hi"}),
                    chat({"content": " there"}), chat({}, "stop"), DONE],
                   [1_700, 2_500, 3_500, 3_600, 3_600])
    record = to_record(raw, 0, 0, 0, TEMPLATE, None)
    assert record.first_token_ns == 2_500
    assert (record.output_tokens, record.output_tokens_source) == (2, "chunks")


def test_reasoning_content_counts_as_generated_text():
    stream = parse_events([1, 2], [chat({"reasoning_content": "hmm"}), chat({"content": "ok"})])
    assert stream.texts == ["hmm", "ok"] and stream.chunk_ns == [1, 2]


def test_thinking_answers_and_tool_call_arguments_all_count():
    """A chunk where the thinking ends and the answer starts carries both; a tool call's
    arguments are generated text too (its id and name are not)."""
    call = {"index": 0, "id": "chatcmpl-tool-1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": '}}
    stream = parse_events([1, 2, 3], [
        chat({"reasoning_content": "so.", "content": "It"}),
        chat({"tool_calls": [call]}),
        chat({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]})])
    assert stream.texts == ["so.It", '{"city": ', '"Paris"}']


def test_comments_and_multiline_data_are_handled():
    block = (b': keep-alive\ndata: {"choices": [{"text": "x",\n'
             b'data: "finish_reason": null}]}')
    stream = parse_events([7], [block])
    assert stream.texts == ["x"]


def test_outcomes():
    def outcome(**fields: object) -> tuple[str, str]:
        defaults = {"events": [completion("a", "stop"), DONE], "times": [2_000, 2_000]}
        events, times = fields.pop("events", defaults["events"]), fields.pop("times",
                                                                              defaults["times"])
        record = to_record(exchange(events, times, **fields), 0, 0, 0, TEMPLATE, None)
        return record.outcome, record.error

    assert outcome() == ("ok", "")
    assert outcome(cancelled=True) == ("cancelled", "cancelled by the benchmark")
    assert outcome(cancelled=True, start_ns=0, events=[], times=[]) == ("cancelled",
                                                                         "never sent")
    assert outcome(error="timeout after 5 s") == ("error", "timeout after 5 s")
    body = json.dumps({"error": {"message": "queue full", "code": 503}})
    assert outcome(status=503, error_body=body, events=[], times=[]) == (
        "error", "HTTP 503: queue full")
    assert outcome(events=[completion("a"), event({"error": {"message": "oom"}})],
                   times=[1, 2]) == ("error", "error in stream: oom")
    assert outcome(events=[completion("a")], times=[1]) == (
        "error", "stream ended without a finish_reason or [DONE]")


def test_chunk_token_counts():
    assert chunk_token_counts([None, None, None], 3) == [1, 1, 1]
    # cumulative usage in every chunk (vLLM continuous_usage_stats) is exact
    assert chunk_token_counts([2, 3, 7], 7) == [2, 1, 4]
    # 10 tokens in 4 chunks without per-chunk usage: first is one, the rest share 9
    assert chunk_token_counts([None] * 4, 10) == [1, 3, 3, 3]
    assert chunk_token_counts([None] * 3, 6) == [1, 3, 2]
    assert chunk_token_counts([None], 5) == [5]
    assert chunk_token_counts([], 0) == []


def test_tokenizer_cross_check_counts_the_output_text(tokenizer_json):
    from inferlab.bench.tokens import TokenCounter

    counter = TokenCounter(tokenizer_json)
    raw = exchange([completion(" the river"), completion(" stone", "length"), USAGE, DONE],
                   [2, 3, 3, 3])
    record = to_record(raw, 0, 0, 0, TEMPLATE, counter)
    assert record.tokenizer_output_tokens == counter.count(" the river stone")

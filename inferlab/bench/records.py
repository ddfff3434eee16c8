"""A finished request as the report sees it, and how a raw exchange becomes one.

All times are integer nanoseconds since the run's epoch (the first stage's start) on
CLOCK_MONOTONIC. Parsing happens in the coordinator, never on a worker's timing path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from inferlab.bench.client import TIMEOUT_ERROR, RawExchange
from inferlab.bench.templates import RequestTemplate
from inferlab.bench.tokens import TokenCounter

OUTCOMES = ("ok", "error", "cancelled")
MAX_ERROR_CHARS = 300


@dataclass
class RequestRecord:
    stage: int
    index: int  # unique within the stage
    outcome: str  # ok | error | cancelled
    error: str  # why it failed ("" when ok)
    status: int  # HTTP status, 0 when no response came
    intended_ns: int  # when the schedule wanted it sent
    start_ns: int | None  # when the client began it; None: never sent
    first_token_ns: int | None  # first chunk with generated text
    end_ns: int | None
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each chunk with text
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each such chunk
    output_tokens: int = 0  # from the server's usage when it sent one
    output_tokens_source: str = "none"  # usage | chunks | none
    prompt_tokens: int | None = None  # from the server's usage
    prompt_tokens_sent: int = 0  # the client's estimate (exact with --tokenizer)
    output_tokens_asked: int | None = None  # max_tokens in the request
    tokenizer_output_tokens: int | None = None  # the output text counted by --tokenizer
    finish_reason: str | None = None
    new_connection: bool = False
    worker: int = 0
    ignore_eos: bool = False  # sent with ignore_eos: output_tokens_asked was the length wanted

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        return cls(**data)


def ended_by_itself(r: RequestRecord) -> bool:
    """Whether the exchange ended on its own (a success or the server's failure), not when
    the benchmark cut it: cancelled at a stage's end or timed out by --request-timeout."""
    return (r.end_ns is not None and r.outcome != "cancelled"
            and not r.error.startswith(TIMEOUT_ERROR))


@dataclass
class _Stream:
    """What the SSE events of one response said."""

    texts: list[str] = field(default_factory=list)
    chunk_ns: list[int] = field(default_factory=list)
    cumulative: list[int | None] = field(default_factory=list)  # usage in each text chunk
    usage: dict | None = None
    finish_reason: str | None = None
    done: bool = False  # saw data: [DONE]
    error: str = ""


def parse_events(event_ns: list[int], events: list[bytes]) -> _Stream:
    stream = _Stream()
    for stamp, block in zip(event_ns, events, strict=True):
        data = _data_of(block)
        if data is None:
            continue
        if data == "[DONE]":
            stream.done = True
            continue
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            stream.error = stream.error or f"bad JSON in stream: {data[:80]!r}"
            continue
        if not isinstance(payload, dict):
            continue
        if payload.get("error"):
            stream.error = _error_text(payload["error"])
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
        if usage is not None:
            stream.usage = usage
        for choice in payload.get("choices") or ():
            text = _choice_text(choice)
            if text:
                stream.texts.append(text)
                stream.chunk_ns.append(stamp)
                stream.cumulative.append(usage.get("completion_tokens") if usage else None)
            stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
    return stream


def _data_of(block: bytes) -> str | None:
    """The joined `data:` lines of one SSE event, or None when it has none."""
    lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n")
             if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(lines).decode("utf-8", "replace").strip()


def _choice_text(choice: dict) -> str:
    if not isinstance(choice, dict):
        return ""
    if isinstance(choice.get("text"), str):
        return choice["text"]
    delta = choice.get("delta") or {}
    # what a chat chunk generated: thinking (vLLM names it both ways), the answer, and pieces of
    # tool calls' arguments, in the order they were written
    calls = delta.get("tool_calls") if isinstance(delta.get("tool_calls"), list) else []
    pieces = [delta.get("reasoning_content") or delta.get("reasoning"), delta.get("content"),
              *((c.get("function") or {}).get("arguments") for c in calls if isinstance(c, dict))]
    return "".join(p for p in pieces if isinstance(p, str))


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def chunk_token_counts(cumulative: list[int | None], output_tokens: int) -> list[int]:
    """Tokens carried by each text chunk.

    Exact when every chunk carried cumulative usage; otherwise one per chunk when the
    counts agree, else the first chunk gets one and the rest share the remainder.
    """
    chunks = len(cumulative)
    if chunks == 0:
        return []
    if all(c is not None for c in cumulative):
        counts = [int(c) for c in cumulative]  # type: ignore[arg-type]
        return [counts[0]] + [b - a for a, b in zip(counts, counts[1:], strict=False)]
    if output_tokens == chunks or output_tokens < chunks:
        return [1] * chunks
    if chunks == 1:
        return [output_tokens]
    rest, gaps = output_tokens - 1, chunks - 1
    base, extra = divmod(rest, gaps)
    return [1] + [base + (1 if i < extra else 0) for i in range(gaps)]


def to_record(raw: RawExchange, stage: int, worker: int, epoch_ns: int,
              template: RequestTemplate, counter: TokenCounter | None) -> RequestRecord:
    """Parse one raw exchange; decides its outcome and token counts."""
    stream = parse_events(raw.event_ns, raw.events)
    usage_out = stream.usage.get("completion_tokens") if stream.usage else None
    if isinstance(usage_out, int):
        output_tokens, source = usage_out, "usage"
    else:
        output_tokens, source = len(stream.texts), "chunks" if stream.texts else "none"
    outcome, error = _outcome(raw, stream)

    def rel(ns: int) -> int | None:
        return ns - epoch_ns if ns else None

    record = RequestRecord(
        stage=stage, index=raw.index, outcome=outcome, error=error[:MAX_ERROR_CHARS],
        status=raw.status, intended_ns=raw.intended_ns - epoch_ns, start_ns=rel(raw.start_ns),
        first_token_ns=rel(stream.chunk_ns[0]) if stream.chunk_ns else None,
        end_ns=rel(raw.end_ns), chunk_ns=[t - epoch_ns for t in stream.chunk_ns],
        chunk_tokens=chunk_token_counts(stream.cumulative, output_tokens),
        output_tokens=output_tokens, output_tokens_source=source,
        prompt_tokens=(stream.usage or {}).get("prompt_tokens"),
        prompt_tokens_sent=template.prompt_tokens, output_tokens_asked=template.output_tokens,
        finish_reason=stream.finish_reason,
        new_connection=raw.new_connection, worker=worker, ignore_eos=template.ignore_eos)
    if counter is not None and counter.exact and stream.texts:
        record.tokenizer_output_tokens = counter.count("".join(stream.texts))
    return record


def _outcome(raw: RawExchange, stream: _Stream) -> tuple[str, str]:
    if raw.cancelled:
        return "cancelled", "cancelled by the benchmark" if raw.start_ns else "never sent"
    if raw.error:
        return "error", raw.error
    if raw.status != 200:
        return "error", f"HTTP {raw.status}: {_http_error_message(raw.error_body)}"
    if stream.error:
        return "error", f"error in stream: {stream.error}"
    if not stream.done and stream.finish_reason is None:
        return "error", "stream ended without a finish_reason or [DONE]"
    return "ok", ""


def _http_error_message(body: str) -> str:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()[:200] or "(empty body)"
    if isinstance(payload, dict) and payload.get("error"):
        return _error_text(payload["error"])
    if isinstance(payload, dict) and payload.get("detail"):
        return str(payload["detail"])
    return body.strip()[:200]

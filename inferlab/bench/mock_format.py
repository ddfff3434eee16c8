"""Bytes the mock OpenAI server sends: SSE chunks, usage, errors, Prometheus text.

Everything a stream needs is encoded once per request, so the per-token cost on the
mock's event loop is one concatenation and one socket write.
"""

from __future__ import annotations

import json
import time

# Words that are one token in every common BPE vocabulary, so a tokenizer cross-check
# of the mock's output agrees with the token count the mock reports.
WORDS = (" the", " of", " and", " to", " in", " is", " was", " for")
DONE_EVENT = b"data: [DONE]\n\n"


def http_chunk(payload: bytes) -> bytes:
    """One piece of a chunked transfer-encoded body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def response_head(status: int, content_type: str, length: int | None) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    lines = [f"HTTP/1.1 {status} {reason.get(status, 'Error')}", f"Content-Type: {content_type}"]
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def json_response(status: int, payload: object) -> bytes:
    body = json.dumps(payload).encode()
    return response_head(status, "application/json", len(body)) + body


def error_response(status: int, message: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json_response(status, {"error": {"message": message, "type": kind, "code": status}})


class StreamEncoder:
    """Encodes the SSE events of one streamed completion (text or chat)."""

    def __init__(self, request_id: int, model: str, chat: bool) -> None:
        self.chat = chat
        kind = "chat.completion.chunk" if chat else "text_completion"
        prefix = "chatcmpl" if chat else "cmpl"
        head = {"id": f"{prefix}-{request_id}", "object": kind,
                "created": int(time.time()), "model": model}
        # split the JSON of a content chunk around its text, to splice each token in
        marker = "\u0000TEXT\u0000"
        choice = ({"index": 0, "delta": {"content": marker}, "finish_reason": None} if chat
                  else {"index": 0, "text": marker, "logprobs": None, "finish_reason": None})
        encoded = json.dumps({**head, "choices": [choice]})
        before, after = encoded.split(json.dumps(marker)[1:-1])
        self.before, self.after = b"data: " + before.encode(), after.encode() + b"\n\n"
        self.head = head

    def content(self, text: str) -> bytes:
        return http_chunk(self.before + json.dumps(text)[1:-1].encode() + self.after)

    def role(self) -> bytes:
        """vLLM's first chat chunk: the role, no content (must not count as a token)."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""},
                  "finish_reason": None}
        return self._event({**self.head, "choices": [choice]})

    def finish(self, reason: str) -> bytes:
        choice = ({"index": 0, "delta": {}, "finish_reason": reason} if self.chat
                  else {"index": 0, "text": "", "logprobs": None, "finish_reason": reason})
        return self._event({**self.head, "choices": [choice]})

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        return self._event({**self.head, "choices": [], "usage": usage})

    def error(self, message: str) -> bytes:
        return self._event({"error": {"message": message, "type": "server_error", "code": 500}})

    @staticmethod
    def _event(payload: dict) -> bytes:
        return http_chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


def token_text(count: int, offset: int = 0) -> str:
    return "".join(WORDS[(offset + i) % len(WORDS)] for i in range(count))


def prometheus_text(running: int, waiting: int, kv_usage: float, prefix_queries: int,
                    prefix_hits: int, model: str) -> bytes:
    """The mock's /metrics page, with vLLM's metric names and labels."""
    label = f'{{model_name="{model}",engine="0"}}'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{label} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{label} {waiting}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{label} {kv_usage}",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{label} {prefix_queries}",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{label} {prefix_hits}",
    ]
    return ("\n".join(lines) + "\n").encode()

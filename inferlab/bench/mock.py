"""A mock OpenAI-compatible server with injected latency and failure modes.

`inferlab bench mock-server` runs it on its own; the benchmark starts one with zero
latency to measure its own floor. It is a real HTTP/1.1 server on asyncio sockets:
keep-alive, chunked SSE streams, `/v1/completions`, `/v1/chat/completions`,
`/v1/models`, `/health` and a `/metrics` page with vLLM's metric names.

Token k of a request is written at `start + ttft + k * itl` on an absolute schedule,
so timer jitter does not accumulate along a stream; `start` is its arrival, or, for one
that queued behind `max_running` streams, when a slot freed (its TTFT, counted from
arrival, includes the wait, as a real server's does). A "token" is a word: prompts are
counted in whitespace-separated words, and the output is common one-token words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import OrderedDict
from dataclasses import dataclass

from inferlab.bench import mock_format as fmt
from inferlab.bench.config import check_duration, url_host
from inferlab.bench.mock_http import Connection, Emitter, Request
from inferlab.errors import InferlabError

PREFIX_BLOCK_WORDS = 16  # the mock's prefix cache works on blocks of this many words
PREFIX_CACHE_BLOCKS = 100_000  # LRU bound on remembered block hashes
UNLIMITED_MODEL_LEN = 2**62  # --max-model-len of a mock that refuses no length


@dataclass(frozen=True)
class MockConfig:
    """Latency and failures to inject; rates are fractions of requests, drawn per request."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    model: str = "mock-model"
    ttft_ms: float = 0.0  # from a stream's start (see the module doc) to its first chunk
    itl_ms: float = 0.0  # between consecutive tokens
    tokens_per_chunk: int = 1  # tokens carried by each SSE content chunk
    default_max_tokens: int = 16  # when a request does not say (less where the context ends)
    max_model_len: int = 131072  # prompt words + max_tokens above it: a 400, as vLLM answers
    max_running: int = 0  # streams served at once; the rest wait (0: no limit)
    error_rate: float = 0.0  # answer HTTP 500 with an OpenAI error body
    hang_rate: float = 0.0  # stop sending halfway through the stream, forever
    close_rate: float = 0.0  # close the connection halfway through the stream
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:  # the words of `inferlab serve`'s ServerSettings
            raise InferlabError(f"port must be in [0, 65535], got {self.port}")
        for flag, ms in (("--ttft-ms", self.ttft_ms), ("--itl-ms", self.itl_ms)):
            check_duration(flag, ms, zero_ok=True, unit="ms")
        for flag, value, least in (("--tokens-per-chunk", self.tokens_per_chunk, 1),
                                   ("--default-max-tokens", self.default_max_tokens, 1),
                                   ("--max-model-len", self.max_model_len, 1),
                                   ("--max-running", self.max_running, 0)):
            if value < least:
                raise InferlabError(f"{flag} must be >= {least}, got {value}")
        if self.default_max_tokens > self.max_model_len:
            raise InferlabError(f"--default-max-tokens ({self.default_max_tokens}) is above "
                                f"--max-model-len ({self.max_model_len})")
        rates = (self.error_rate, self.hang_rate, self.close_rate)
        # written so that NaN, which compares false to everything, fails too
        if not (all(rate >= 0 for rate in rates) and sum(rates) <= 1):
            raise InferlabError("--error-rate, --hang-rate and --close-rate must be >= 0 and "
                                f"sum to <= 1, got {list(rates)}")


class _PrefixCache:
    """Chained hashes of full word blocks, to report prefix-cache hits like vLLM does."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt words looked up
        self.hits = 0  # prompt words found cached

    def lookup(self, words: list[str]) -> None:
        self.queries += len(words)
        parent, hit = 0, True
        for start in range(0, len(words) - PREFIX_BLOCK_WORDS + 1, PREFIX_BLOCK_WORDS):
            parent = hash((parent, tuple(words[start:start + PREFIX_BLOCK_WORDS])))
            if hit and parent in self.blocks:
                self.hits += PREFIX_BLOCK_WORDS
                self.blocks.move_to_end(parent)
            else:
                hit = False
                self.blocks[parent] = None
        while len(self.blocks) > PREFIX_CACHE_BLOCKS:
            self.blocks.popitem(last=False)


class MockServer:
    """The server state: counters for /metrics and the failure-mode draw."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.requests = 0
        self.running = 0
        self.waiting = 0
        self.running_tokens = 0  # prompt + output words of running streams, for KV usage
        self.prefix = _PrefixCache()
        self.slots = asyncio.Semaphore(config.max_running) if config.max_running else None
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Connection(self.handle), self.config.host,
                                               self.config.port, backlog=4096)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{url_host(host)}:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def handle(self, request: Request, conn: Connection) -> bool:
        """Answer one request; False when the connection must not be reused."""
        method, path = request.method, request.path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            conn.write(fmt.json_response(200, {"status": "ok"}))
        elif method == "GET" and path == "/v1/models":
            model = {"id": self.config.model, "object": "model", "owned_by": "inferlab"}
            conn.write(fmt.json_response(200, {"object": "list", "data": [model]}))
        elif method == "GET" and path == "/metrics":
            conn.write(self._metrics())
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self._completion(path.endswith("chat/completions"), request, conn)
        else:
            conn.write(fmt.error_response(404, f"no route for {method} {path}"))
        return True

    def _metrics(self) -> bytes:
        capacity = max(1, (self.config.max_running or 64) * 2048)
        text = fmt.prometheus_text(self.running, self.waiting,
                                   min(1.0, self.running_tokens / capacity),
                                   self.prefix.queries, self.prefix.hits, self.config.model)
        return fmt.response_head(200, "text/plain; version=0.0.4", len(text)) + text

    async def _completion(self, chat: bool, raw: Request, conn: Connection) -> bool:
        try:
            request = json.loads(raw.body)
            prompt_words = _prompt_words(request, chat)
        except (ValueError, TypeError, AttributeError) as e:
            conn.write(fmt.error_response(400, f"bad request body: {e}"))
            return True
        try:
            max_tokens = self._max_tokens(request, len(prompt_words))
        except ValueError as e:
            conn.write(fmt.error_response(400, str(e)))
            return True
        self.requests += 1
        mode = self._draw_mode()
        if mode == "error":
            conn.write(fmt.error_response(500, "injected error"))
            return True
        self.waiting += 1
        start = await self._admit(raw.arrival)
        self.waiting -= 1
        self.running += 1
        self.running_tokens += len(prompt_words)
        self.prefix.lookup(prompt_words)
        try:
            stream = _StreamJob(self, request, chat, len(prompt_words), max_tokens, mode)
            return await stream.run(start, conn)
        finally:
            self.running -= 1
            self.running_tokens -= len(prompt_words)
            if self.slots is not None:
                self.slots.release()

    def _max_tokens(self, request: dict, prompt_tokens: int) -> int:
        """The request's max_tokens (or max_completion_tokens) as vLLM reads it: an integer
        (_lax_int), at least 1, within the context with the prompt; a missing one is --default-max-tokens
        cut to what the context leaves. ValueError for one vLLM answers with a 400."""
        room = self.config.max_model_len - prompt_tokens
        given = next((request[k] for k in ("max_tokens", "max_completion_tokens")
                      if request.get(k) is not None), None)
        if given is None:
            if room < 1:
                raise ValueError(f"this model's maximum context length is "
                                 f"{self.config.max_model_len} tokens; the prompt has "
                                 f"{prompt_tokens}, which leaves no room for a completion")
            return min(self.config.default_max_tokens, room)
        max_tokens = _lax_int(given)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if max_tokens > room:
            raise ValueError(f"this model's maximum context length is {self.config.max_model_len} "
                             f"tokens; the request asks for {prompt_tokens + max_tokens} "
                             f"({prompt_tokens} in the prompt, {max_tokens} in the completion)")
        return max_tokens

    async def _admit(self, arrival: float) -> float:
        """Wait for a free slot; returns when the stream's schedule starts."""
        if self.slots is None:
            return arrival
        queued = self.slots.locked()
        await self.slots.acquire()
        return asyncio.get_running_loop().time() if queued else arrival

    def _draw_mode(self) -> str:
        u, c = self.rng.random(), self.config
        for mode, rate in (("error", c.error_rate), ("hang", c.hang_rate),
                           ("close", c.close_rate)):
            if u < rate:
                return mode
            u -= rate
        return "ok"


class _StreamJob:
    """Writes one completion's tokens on schedule (or fails as drawn)."""

    def __init__(self, server: MockServer, request: dict, chat: bool, prompt_tokens: int,
                 max_tokens: int, mode: str) -> None:
        self.server, self.chat, self.mode = server, chat, mode
        self.stream = bool(request.get("stream", False))
        options = request.get("stream_options")  # vLLM: given at all, include_usage defaults to true
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage", True))
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.encoder = fmt.StreamEncoder(server.requests, server.config.model, chat)

    async def run(self, start: float, conn: Connection) -> bool:
        loop = asyncio.get_running_loop()
        config = self.server.config
        ttft_s, itl_s = config.ttft_ms / 1000, config.itl_ms / 1000
        if not self.stream:
            await asyncio.sleep(max(0.0, start + ttft_s + (self.max_tokens - 1) * itl_s
                                    - loop.time()))
            conn.write(fmt.json_response(200, self._whole_response()))
            return True
        conn.write(fmt.response_head(200, "text/event-stream", None))
        if self.chat:
            conn.write(self.encoder.role())
        chunks = self._encode_chunks(config.tokens_per_chunk)
        dues = [start + ttft_s + (last - 1) * itl_s for last, _ in chunks]
        stop_at = self.max_tokens // 2 if self.mode in ("hang", "close") else self.max_tokens
        outcome = await Emitter(conn, loop, chunks, dues, stop_at).finished
        if outcome == "fail":
            await self._fail(conn)
        if outcome != "done":
            return False
        conn.write(self.encoder.finish("length"))
        if self.include_usage:
            conn.write(self.encoder.usage(self.prompt_tokens, self.max_tokens))
        conn.write(fmt.http_chunk(fmt.DONE_EVENT) + b"0\r\n\r\n")
        return True

    def _encode_chunks(self, per_chunk: int) -> list[tuple[int, bytes]]:
        """(tokens sent once this chunk is out, its bytes) for every content chunk."""
        cache: dict[tuple[int, int], bytes] = {}  # the words cycle, so few distinct chunks
        chunks = []
        for first in range(0, self.max_tokens, per_chunk):
            count = min(per_chunk, self.max_tokens - first)
            key = (count, first % len(fmt.WORDS))
            if key not in cache:
                cache[key] = self.encoder.content(fmt.token_text(count, first))
            chunks.append((first + count, cache[key]))
        return chunks

    async def _fail(self, conn: Connection) -> None:
        if self.mode == "close":
            conn.abort()
        else:  # hang: send nothing more until the client gives up
            await conn.lost

    def _whole_response(self) -> dict:
        text = fmt.token_text(self.max_tokens)
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.max_tokens,
                 "total_tokens": self.prompt_tokens + self.max_tokens}
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length"}
        return {**self.encoder.head, "object": "chat.completion" if self.chat
                else "text_completion", "choices": [choice], "usage": usage}


def _lax_int(value: object) -> int:
    """An int field as vLLM's pydantic models read one (not strict): a bool, a whole float or a
    string of digits turns into the int; anything else is a ValueError."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int | str):  # a bool is an int
        with contextlib.suppress(ValueError):
            return int(value)
    raise ValueError(f"max_tokens must be an integer, got {value!r}")


def _prompt_words(request: dict, chat: bool) -> list[str]:
    if chat:
        messages = request["messages"]
        text = " ".join(str(m.get("content") or "") for m in messages)
    else:
        prompt = request["prompt"]
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return text.split()

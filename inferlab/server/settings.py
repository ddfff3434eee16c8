"""The server's own settings (the engine's live in EngineConfig), validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.errors import InferlabError
from inferlab.server.reasoning import REASONING_PARSERS
from inferlab.server.tool_call_formats import AUTO_PARSERS

# An idle engine loop refreshes its heartbeat every 0.2 s (async_engine._IDLE_WAIT_S), a busy
# one after every step: /health would flap on an idle server with a limit near that.
MIN_HEALTH_MAX_SILENCE_S = 1.0


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str  # the name /v1/models lists first and metrics carry
    # further names requests may use (vLLM's --served-model-name a b: a is served_model_name)
    served_model_aliases: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000  # 0: an ephemeral port, printed when ready
    api_key: str | None = None  # None: no authentication
    # Sequences (prompts x n) waiting for the engine (admission.py counts them); more get 503.
    max_queued_requests: int = 256
    max_request_body_bytes: int = 8 * 2**20  # larger bodies get 413
    shutdown_timeout_s: float = 10.0  # on SIGTERM: in-flight requests get this long, then abort
    # /health is 503 when the engine loop has not gone round for this long (a stalled step).
    health_max_silence_s: float = 30.0
    # an idle keep-alive connection is closed after this long (uvicorn's and vLLM's 5 s)
    keep_alive_timeout_s: float = 5.0
    retry_after_s: int = 1  # the Retry-After header on 503s
    chat_template: str | None = None  # instead of the model's (vLLM's --chat-template); None: its own
    # browser origins allowed to call the API (CORS), "*" for any; empty: none (vLLM allows any)
    allowed_origins: tuple[str, ...] = ()
    # tool_choice "auto": the model's calls are read out of its text by this parser (vLLM's flags)
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None  # hermes, llama3_json or mistral
    exclude_tools_when_tool_choice_none: bool = False  # the template sees no tools with "none"
    reasoning_parser: str | None = None  # deepseek_r1 or qwen3: thinking as reasoning_content

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name requests may use, the served_model_name first, each once."""
        return tuple(dict.fromkeys((self.served_model_name, *self.served_model_aliases)))

    def __post_init__(self) -> None:
        checks = [
            (bool(self.served_model_name) and all(self.served_model_aliases),
             "a served model name must not be empty"),
            (0 <= self.port <= 65535, f"port must be in [0, 65535], got {self.port}"),
            (self.api_key is None or bool(self.api_key.strip()), "the API key must not be empty "
             "or blank"),
            # the server strips the key a request sends (so do HTTP parsers, of a header's ends)
            (self.api_key is None or self.api_key == self.api_key.strip(), "the API key must not "
             "start or end with whitespace: no request's key could match it"),
            (self.max_queued_requests >= 1,
             f"max queued requests must be at least 1, got {self.max_queued_requests}"),
            (self.max_request_body_bytes > 0,
             f"max request body must be positive, got {self.max_request_body_bytes}"),
            (self.shutdown_timeout_s >= 0,
             f"shutdown timeout must be >= 0 s, got {self.shutdown_timeout_s}"),
            (self.health_max_silence_s >= MIN_HEALTH_MAX_SILENCE_S,
             f"health max silence must be at least {MIN_HEALTH_MAX_SILENCE_S:g} s (an idle engine "
             f"reports every 0.2 s), got {self.health_max_silence_s:g}"),
            (self.keep_alive_timeout_s > 0,
             f"keep-alive timeout must be > 0 s, got {self.keep_alive_timeout_s}"),
            (self.retry_after_s >= 0, f"retry-after must be >= 0 s, got {self.retry_after_s}"),
            (self.tool_call_parser in (None, *AUTO_PARSERS), f"tool call parser "
             f"{self.tool_call_parser!r} is not one of {', '.join(AUTO_PARSERS)}"),
            (not self.enable_auto_tool_choice or self.tool_call_parser is not None,
             "--enable-auto-tool-choice needs --tool-call-parser"),
            (self.reasoning_parser in (None, *REASONING_PARSERS), f"reasoning parser "
             f"{self.reasoning_parser!r} is not one of {', '.join(REASONING_PARSERS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InferlabError(message)

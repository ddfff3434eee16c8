"""Helpers for the server tests: a real uvicorn server in a thread, /metrics parsing, clients."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from inferlab.engine.engine_counters import EngineStats
from inferlab.engine.scheduler import SchedulerStats

API_KEY = "sk-inferlab-test"
MODEL_NAME = "smollm2-test"
MAX_MODEL_LEN = 512
# the labels of vLLM's series as /metrics prints them (sorted), and of our own
VLLM_LABELS = f'engine="0",model_name="{MODEL_NAME}"'
OWN_LABELS = f'model_name="{MODEL_NAME}"'
# what a fake engine's stats() gives: nothing running, waiting or counted, one free KV block
IDLE_STATS = EngineStats(SchedulerStats(num_running=0, num_waiting=0, kv_cache_usage=0.0,
                                        num_blocks=1, block_size=16, enable_prefix_caching=True,
                                        num_free_blocks=1,
                                        prefix_cache_queried_tokens=0, prefix_cache_hit_tokens=0,
                                        num_preemptions_total=0),
                         prompt_tokens_total=0, generation_tokens_total=0, requests_finished={})


class IdleEngine:
    """What ServerMetrics reads of an engine, with nothing running: tests feed it outputs by
    hand."""

    heartbeat = 0.0
    max_model_len = MAX_MODEL_LEN

    def observe_steps(self, method) -> None:
        """No engine steps to report."""

    def stats(self) -> EngineStats:
        return IDLE_STATS

@dataclass
class RunningServer:
    url: str
    api_key: str | None
    engine: object  # the AsyncEngine behind it

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """Series (name plus labels, as printed) -> value, from GET /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            match = re.fullmatch(r"([^#\s][^\s{]*(?:\{[^}]*\})?)\s+(\S+)", line.strip())
            if match:
                values[match.group(1)] = float(match.group(2))
        return values

    def metric(self, name: str, **labels: str) -> float:
        wanted = {"model_name": MODEL_NAME, **labels}
        if name.startswith("vllm:"):
            wanted["engine"] = "0"  # vLLM's engine index: one engine
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(wanted.items()))
        return self.metrics()[f"{name}{{{label_text}}}"]


def start_server(engine, api_key: str | None = None, **settings) -> Iterator[RunningServer]:
    """Serve `engine` on an ephemeral port until the generator is closed."""
    from inferlab.server.app import create_app
    from inferlab.server.runner import ServerThread
    from inferlab.server.settings import ServerSettings

    # A test client's pooled connection can sit idle past uvicorn's 5 s between tests; a server
    # closing it just as the client reuses it fails that request ("Server disconnected without
    # sending a response"), so the test servers keep idle connections open.
    settings.setdefault("keep_alive_timeout_s", 3600.0)
    app = create_app(engine, ServerSettings(served_model_name=MODEL_NAME, api_key=api_key,
                                            **settings))
    thread = ServerThread(app)
    url = thread.start()
    try:
        yield RunningServer(url, api_key, engine)
    finally:
        thread.stop()


def async_client(server: RunningServer):
    """An AsyncOpenAI client; make one per asyncio.run (its connections belong to one loop)."""
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.api_key or "none",
                              max_retries=0, timeout=120)


def wait_until(condition, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


def tokenize(server, **body) -> list[int]:
    r = httpx.post(f"{server.url}/tokenize", json=body, headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def token_counts(usage) -> tuple[int, int, int]:
    """The token counts; prompt_tokens_details.cached_tokens differ between two identical
    requests (the second hits the first's blocks)."""
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def requests_finished(server) -> float:
    """vllm:request_success_total summed over its finish reasons."""
    return sum(value for series, value in server.metrics().items()
               if series.startswith("vllm:request_success_total{"))


def engine_idle(server) -> bool:
    """No request running or queued, every KV block free, nothing admitted."""
    m = server.metrics()
    vllm, own = f"{{{VLLM_LABELS}}}", f"{{{OWN_LABELS}}}"
    return (m[f"vllm:num_requests_running{vllm}"] == 0
            and m[f"vllm:num_requests_waiting{vllm}"] == 0
            and m[f"vllm:kv_cache_usage_perc{vllm}"] == 0
            and m[f"inferlab:kv_cache_free_blocks{own}"] == m[f"inferlab:kv_cache_blocks{own}"]
            and m[f"inferlab:num_requests_in_flight{own}"] == 0)

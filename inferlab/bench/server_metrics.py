"""The server's own view during a run: its Prometheus /metrics page, scraped on a timer.

vLLM's names first (inferlab's server uses them too), then llama.cpp's, TGI's and
SGLang's equivalents, so the report's server timeline works against any of them.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx

from inferlab.bench.config import NS_PER_S

# canonical series -> metric names that carry it, first match wins
SERIES = {
    "running": ("vllm:num_requests_running", "llamacpp:requests_processing",
                "tgi_batch_current_size", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "tgi_queue_size",
                "sglang:num_queue_reqs"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                       "llamacpp:kv_cache_usage_ratio", "sglang:token_usage"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
                          "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                             "vllm:gpu_prefix_cache_queries_total"),
    # speculative decoding, on servers that draft
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "accepted_draft_tokens": ("vllm:spec_decode_num_accepted_tokens_total",
                              "vllm:spec_decode_num_accepted_tokens"),
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (exposition text format)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isnan(value):
            totals[name.strip()] = totals.get(name.strip(), 0.0) + value
    return totals


def canonical(values: dict[str, float]) -> dict[str, float]:
    out = {}
    for series, names in SERIES.items():
        for name in names:
            if name in values:
                out[series] = values[name]
                break
    return out


@dataclass
class ServerTimeline:
    available: bool = False
    note: str = ""  # why there is no server view, when there is none
    t_s: list[float] = field(default_factory=list)  # seconds since the run's epoch
    series: dict[str, list[float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def prefix_hit_rate(self) -> list[float | None]:
        """Hits / queries between consecutive scrapes (None where nothing was looked up)."""
        return self._rate("prefix_cache_hits", "prefix_cache_queries")

    def draft_acceptance_rate(self) -> list[float | None]:
        """Draft tokens kept / drafted between consecutive scrapes (None where none was)."""
        return self._rate("accepted_draft_tokens", "draft_tokens")

    def _rate(self, part: str, whole: str) -> list[float | None]:
        """The growth of counter `part` over that of counter `whole`, scrape to scrape."""
        parts, wholes = self.series.get(part), self.series.get(whole)
        if not parts or not wholes:
            return []
        out: list[float | None] = [None]
        for i in range(1, len(parts)):
            p0, p1, w0, w1 = parts[i - 1], parts[i], wholes[i - 1], wholes[i]
            if None in (p0, p1, w0, w1) or w1 - w0 <= 0:  # type: ignore[operator]
                out.append(None)
            else:
                out.append((p1 - p0) / (w1 - w0))  # type: ignore[operator]
        return out


class MetricsScraper:
    """Polls `<target>/metrics` on a thread until stopped."""

    def __init__(self, base_url: str, epoch_ns: int, interval_s: float,
                 headers: dict[str, str]) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.epoch_ns, self.interval_s = epoch_ns, interval_s
        self.headers = headers
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.note = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> ServerTimeline:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.timeline()

    def _run(self) -> None:
        with httpx.Client(timeout=min(2.0, self.interval_s * 2), headers=self.headers) as client:
            while not self._stop.is_set():
                if not self._scrape(client):
                    return
                self._stop.wait(self.interval_s)

    def _scrape(self, client: httpx.Client) -> bool:
        """One scrape; False when the target has no usable /metrics page."""
        stamp = time.monotonic_ns()
        try:
            response = client.get(self.url)
        except httpx.HTTPError as e:
            if not self.samples:
                self.note = f"no server metrics: {self.url} unreachable ({type(e).__name__})"
                return False
            return True  # a busy server may miss one scrape; keep going
        if response.status_code != 200:
            self.note = f"no server metrics: {self.url} answered HTTP {response.status_code}"
            return False
        values = canonical(parse_prometheus(response.text))
        if not values:
            self.note = f"no server metrics: {self.url} has no known metric names"
            return False
        self.samples.append(((stamp - self.epoch_ns) / NS_PER_S, values))
        return True

    def timeline(self) -> ServerTimeline:
        if not self.samples:
            return ServerTimeline(False, self.note or "no server metrics scraped")
        names = [s for s in SERIES if any(s in values for _, values in self.samples)]
        return ServerTimeline(True, self.note, [t for t, _ in self.samples],
                              {s: [values.get(s) for _, values in self.samples] for s in names})

"""The benchmark's settings: one dataclass per concern, each checked when built."""

from __future__ import annotations

import math
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from inferlab.errors import InferlabError
from inferlab.key_values import bad_value, key_value_list
from inferlab.user_files import is_user_file, stat_user_path

PROFILES = ("synchronous", "concurrent", "throughput", "constant", "poisson", "sweep")
# profiles whose own streams bound what is in flight, so an in-flight cap means nothing
CLOSED_LOOPS = {"synchronous": "it sends one request at a time",
                "concurrent": "its streams (--rate) are the requests in flight"}
SLO_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
# durations become ns timers and event-loop deadlines: a bound keeps them finite, and no
# benchmark runs for a year
MAX_SECONDS = 365 * 24 * 3600.0
NS_PER_S = 1e9  # here, not beside metrics.NS_PER_MS: the client and workers import config only
MAX_RATE = 100_000  # requests a second one process can send, and far past what it measures well
MAX_STREAMS = 10_000  # concurrent streams: one connection each
MAX_WORKERS = 64  # client processes; each is a Python interpreter (~50 MB)
REPORT_SUFFIXES = (".json", ".csv", ".html")  # the --output formats, by file extension
UNITS_PER_SECOND = {"seconds": 1, "ms": 1000}
API_ROOT = "/v1"  # where the OpenAI-compatible routes start on the server


def check_duration(flag: str, value: float, *, zero_ok: bool, unit: str = "seconds") -> None:
    """Refuse a duration that is negative (or zero unless allowed), NaN, or over a year."""
    above = value >= 0 if zero_ok else value > 0
    most = MAX_SECONDS * UNITS_PER_SECOND[unit]
    if not (above and value <= most):
        bound = ">= 0" if zero_ok else "> 0"
        raise InferlabError(f"{flag} must be {bound} and at most {most:.0f} {unit} (a year), "
                            f"got {value}")


@dataclass(frozen=True)
class Span:
    """A warmup or cooldown: seconds, or a fraction of the stage (see resolve)."""

    seconds: float = 0.0
    fraction: float = 0.0

    def check(self, flag: str) -> None:
        check_duration(flag, self.seconds, zero_ok=True)
        if not 0 <= self.fraction < 1:
            raise InferlabError(f"{flag} as a fraction must be in [0, 1), got {self.fraction}")

    @classmethod
    def parse(cls, text: str, flag: str) -> Span:
        """'5' or '5s': seconds; '0.1' (below 1) or '10%': a fraction of the stage."""
        text = text.strip()
        try:
            if text.endswith("%"):
                return cls(fraction=float(text[:-1]) / 100)
            if text.endswith("s"):
                return cls(seconds=float(text[:-1]))
            value = float(text)
        except ValueError:
            raise InferlabError(f"bad {flag} {text!r}: use 5, 5s, 0.1 or 10%") from None
        return cls(fraction=value) if 0 < value < 1 else cls(seconds=value)

    def resolve_s(self, duration_s: float) -> float:
        return self.seconds + self.fraction * duration_s

    def resolve(self, duration_s: float, requests_bound: int | None) -> tuple[float, int]:
        """(seconds, requests) it leaves out. A fraction is of the requests where
        --max-requests alone bounds the stage (`requests_bound`), as guidellm's
        TransientPhaseConfig counts it: a throughput or concurrent stage starts its requests
        at once, so no fraction of its duration would hold a measured request's start."""
        if requests_bound is None:
            return self.resolve_s(duration_s), 0
        return self.seconds, int(self.fraction * requests_bound)


@dataclass(frozen=True)
class StageLimits:
    """When one stage stops, and which part of it the statistics use."""

    max_seconds: float | None = None  # stop sending after this long
    max_requests: int | None = None  # stop after sending this many
    max_error_rate: float | None = None  # stop once this fraction of finished requests failed
    warmup: Span = field(default_factory=Span)
    cooldown: Span = field(default_factory=Span)
    drain_seconds: float = 10.0  # after max_seconds, how long in-flight requests may finish
    request_timeout_s: float = 120.0  # a request still running after this is an error

    def __post_init__(self) -> None:
        if self.max_seconds is None and self.max_requests is None:
            raise InferlabError("each stage needs a bound: set --max-seconds or --max-requests")
        if self.max_seconds is not None:
            check_duration("--max-seconds", self.max_seconds, zero_ok=False)
        if self.max_requests is not None and self.max_requests < 1:
            raise InferlabError(f"--max-requests must be >= 1, got {self.max_requests}")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate <= 1:
            raise InferlabError(f"--max-error-rate must be in [0, 1], got {self.max_error_rate}")
        check_duration("--drain-seconds", self.drain_seconds, zero_ok=True)
        check_duration("--request-timeout", self.request_timeout_s, zero_ok=False)
        self.warmup.check("--warmup")
        self.cooldown.check("--cooldown")

    @property
    def requests_bound(self) -> int | None:
        """--max-requests where it alone bounds the stage: a fractional warmup or cooldown
        then counts requests (Span.resolve)."""
        return self.max_requests if self.max_seconds is None else None

    @property
    def max_ns(self) -> int | None:
        """--max-seconds in whole ns: the schedule and the workers stop sending at one instant."""
        return None if self.max_seconds is None else round(self.max_seconds * NS_PER_S)


@dataclass(frozen=True)
class Slo:
    """Service-level objective: per-request bounds in ms (None: not bounded)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in SLO_METRICS:
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise InferlabError(f"--slo {name} must be a finite number > 0 ms, got {value}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        values: dict[str, float] = {}
        form = f"{','.join(name + '=N' for name in SLO_METRICS)} (milliseconds)"
        for key, value in key_value_list(text, "--slo", form, SLO_METRICS).items():
            try:
                values[key] = float(value)
            except ValueError:
                raise bad_value("--slo", key, value, "milliseconds") from None
        if not values:
            raise InferlabError("--slo needs at least one bound, e.g. ttft_ms=500")
        return cls(**values)

    def bounds(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in SLO_METRICS
                if getattr(self, name) is not None}


@dataclass(frozen=True)
class LoadConfig:
    """What load to put on the server: the profile and its rates."""

    profile: str
    rates: tuple[float, ...] = ()  # req/s (constant, poisson) or streams (concurrent)
    max_concurrency: int | None = None  # throughput's streams; a cap on rate stages
    # a sweep's stages in all, as guidellm's sweep_size (and its default): synchronous,
    # throughput, then sweep_size - 2 constant rates up to the throughput rate
    sweep_size: int = 10
    sync_max_seconds: float = 15.0  # a sweep's synchronous stage never runs longer
    ramp_up_s: float = 0.0  # streams start spread evenly over this many seconds
    seed: int = 0
    slo_search: bool = False
    slo_search_steps: int = 5

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise InferlabError(f"unknown --profile {self.profile!r}; one of {PROFILES}")
        needs_rate = self.profile in ("concurrent", "constant", "poisson")
        if needs_rate and not self.rates:
            raise InferlabError(f"--profile {self.profile} needs --rate")
        if self.profile == "sweep" and self.rates:  # guidellm reads it as the stage count
            raise InferlabError("--profile sweep takes no --rate: its number of stages is "
                                "--sweep-size (guidellm's --rate for a sweep)")
        if not needs_rate and self.rates:
            what = "--max-concurrency" if self.profile == "throughput" else "no rate"
            raise InferlabError(f"--profile {self.profile} takes {what}, not --rate")
        # before the range check, in the words of streams (NaN and inf are no integers)
        if self.profile == "concurrent" and not all(r >= 1 and float(r).is_integer()
                                                    for r in self.rates):
            raise InferlabError(f"--profile concurrent takes --rate as a whole number of "
                                f"streams >= 1, got {list(self.rates)}")
        # a send schedule spaces requests 1 / rate apart: a slower one overflows its clock
        if any(not (1 / MAX_SECONDS <= r < math.inf) for r in self.rates):
            raise InferlabError(f"--rate values must be at least {1 / MAX_SECONDS:.3g} (one "
                                f"request a year) and finite, got {list(self.rates)}")
        # more than one client process drives: a schedule of 10^8 sends was built in memory
        most, unit = (MAX_STREAMS, "streams") if self.profile == "concurrent" else (MAX_RATE, "req/s")
        if any(r > most for r in self.rates):
            raise InferlabError(f"--rate values above {most:,} {unit} are more than one load "
                                f"tester drives, got {list(self.rates)}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise InferlabError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_concurrency is not None and self.profile in CLOSED_LOOPS:
            raise InferlabError(f"--profile {self.profile} takes no --max-concurrency: "
                                f"{CLOSED_LOOPS[self.profile]}")
        if self.sweep_size < 2:
            raise InferlabError(f"--sweep-size counts a sweep's stages in all, its synchronous "
                                f"and throughput stages included: it must be >= 2, got "
                                f"{self.sweep_size}")
        if self.slo_search_steps < 1:
            raise InferlabError(f"--slo-search-steps must be >= 1, got {self.slo_search_steps}")
        check_duration("--ramp-up", self.ramp_up_s, zero_ok=True)
        check_duration("--sweep-sync-seconds", self.sync_max_seconds, zero_ok=False)
        self._check_profile_options()

    def _check_profile_options(self) -> None:
        """Options the profile would leave unused are refused, not ignored: --ramp-up spreads
        the starts of closed-loop streams (concurrent, throughput, a sweep's throughput stage),
        the sweep options shape a sweep."""
        if self.ramp_up_s and self.profile in ("synchronous", "constant", "poisson"):
            raise InferlabError(f"--profile {self.profile} takes no --ramp-up: it spreads the "
                                "starts of closed-loop streams (--profile concurrent or throughput)")
        if self.profile != "sweep":
            for flag, value, default in (("--sweep-size", self.sweep_size, LoadConfig.sweep_size),
                                         ("--sweep-sync-seconds", self.sync_max_seconds,
                                          LoadConfig.sync_max_seconds)):
                if value != default:
                    raise InferlabError(f"{flag} shapes a sweep; --profile {self.profile} takes none")


# request fields the load tester writes itself, and the flag that sets each: an
# --extra-body value would silently override them (None: no flag, streaming is how
# tokens are timed)
OWN_BODY_FIELDS = {"model": "--model", "prompt": "--data", "messages": "--data",
                   "max_tokens": "--data or --max-tokens", "ignore_eos": "--ignore-eos",
                   "stream": None, "stream_options": "--continuous-usage"}
# fields a server reads in place of one of those: vLLM and OpenAI take max_completion_tokens
# over max_tokens, so the length asked for (and the ignore_eos check) would not be ours
OVERRIDING_BODY_FIELDS = {"max_completion_tokens": "max_tokens"}


@dataclass(frozen=True)
class TargetConfig:
    """The server under test and how to talk to it."""

    url: str
    model: str | None = None  # None: the first model the server lists
    chat: bool = False  # /v1/chat/completions instead of /v1/completions
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    extra_body: tuple[tuple[str, object], ...] = ()  # merged into every request body
    continuous_usage: bool = False  # ask for usage in every chunk (vLLM extension)

    def __post_init__(self) -> None:
        if not self.url.strip():
            raise InferlabError("--target needs a URL, e.g. http://127.0.0.1:8000")
        # every request, /v1/models and /metrics are found from the server's root
        object.__setattr__(self, "url", server_root(_with_scheme(self.url.strip())))
        # header bytes are ASCII to httpx; anything else would fail on the first request
        if self.api_key is not None and not self.api_key.isascii():
            raise InferlabError("--api-key must be ASCII: it is sent in an HTTP header")
        for name, value in self.headers:
            if not (name + value).isascii():
                raise InferlabError(f"--header {name}: HTTP header names and values must be "
                                    "ASCII")
        _check_extra_body(self.extra_body)

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def url_host(host: str) -> str:
    """A host as a URL or a Host header writes it: an IPv6 address in brackets (RFC 3986)."""
    return f"[{host}]" if ":" in host else host


def _with_scheme(url: str) -> str:
    """`url`, http:// added to a bare host[:port] as curl reads one, checked now: a URL the
    requests cannot go to is a user error before the run, not a server "not running"."""
    full = url if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", url) else f"http://{url}"
    try:  # an IPv6 host without its bracket, or a bad port, raises
        parts = urlsplit(full)
        port = parts.port
    except ValueError as e:
        raise InferlabError(f"bad --target {url!r}: {e}") from None
    if port == 0:
        raise InferlabError(f"bad --target {url!r}: port 0 is no server's")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InferlabError(f"bad --target {url!r}: not an http:// or https:// URL with a host, "
                            "e.g. http://127.0.0.1:8000")
    return full


def server_root(url: str) -> str:
    """`url` without a trailing /v1: an OpenAI SDK's base URL (http://host:8000/v1) names
    the same server, and the load tester adds /v1/completions itself."""
    base = url.rstrip("/")
    after_scheme = base.split("://", 1)[-1]
    if "/" in after_scheme and after_scheme.endswith(API_ROOT):  # a path, not a host "v1"
        return base.removesuffix(API_ROOT)
    return url


def _check_extra_body(extra_body: tuple[tuple[str, object], ...]) -> None:
    for key, _ in extra_body:
        own = OVERRIDING_BODY_FIELDS.get(key, key)
        if own in OWN_BODY_FIELDS:
            flag = OWN_BODY_FIELDS[own]
            instead = f"use {flag}" if flag else "it times tokens on a stream"
            sets = "it" if own == key else f"{own}, which it overrides"
            raise InferlabError(f"--extra-body cannot set {key!r}: the load tester sets "
                                f"{sets} ({instead})")


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from."""

    data: str = "prompt_tokens=256,output_tokens=128"  # a synthetic spec or a file
    data_file: str | None = None  # text synthetic prompts are cut from
    tokenizer: str | None = None  # tokenizer.json for exact lengths and the cross-check
    force_length: bool | None = None  # ignore_eos; None: yes for synthetic data only
    default_output_tokens: int = 256  # max_tokens for file records that give none
    seed: int = 0

    def __post_init__(self) -> None:
        if self.default_output_tokens < 1:
            raise InferlabError("--max-tokens must be >= 1")
        # bad data fails here, before the server is contacted
        from inferlab.bench.dataspec import SyntheticSpec, is_synthetic

        if is_synthetic(self.data):
            SyntheticSpec.parse(self.data)
        else:
            found = stat_user_path(self.data)  # None for a name too long to be a file's
            if found is not None and stat.S_ISDIR(found.st_mode):
                raise InferlabError(f"--data {self.data}: is a directory, not a file of "
                                    "prompts")
            if found is None or not stat.S_ISREG(found.st_mode):
                raise InferlabError(f"--data {self.data!r} is neither a synthetic spec "
                                    "(prompt_tokens=N,output_tokens=N) nor an existing file")
        if self.tokenizer is not None and not is_user_file(self.tokenizer):
            raise InferlabError(f"tokenizer file not found: {self.tokenizer!r}")

    def check_corpus(self) -> None:
        """Synthetic prompts' text is there (--data-file, else the default corpus)."""
        from inferlab.bench.dataspec import is_synthetic, resolve_corpus

        if is_synthetic(self.data):
            resolve_corpus(self.data_file)


@dataclass(frozen=True)
class MeasureConfig:
    """How the client runs and checks itself."""

    workers: int | None = None  # None: auto
    calibration_seconds: float = 2.0  # per stage against the zero-latency mock; 0: skip
    scrape_interval_s: float | None = 1.0  # /metrics polling; None: off

    def __post_init__(self) -> None:
        if self.workers is not None and not 1 <= self.workers <= MAX_WORKERS:
            raise InferlabError(f"--workers must be in [1, {MAX_WORKERS}], got {self.workers}")
        check_duration("--calibration-seconds", self.calibration_seconds, zero_ok=True)
        if self.scrape_interval_s is not None:
            check_duration("--scrape-interval", self.scrape_interval_s, zero_ok=False)


@dataclass(frozen=True)
class BenchConfig:
    target: TargetConfig
    load: LoadConfig
    limits: StageLimits
    data: DataConfig = field(default_factory=DataConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    slo: Slo | None = None
    outputs: tuple[str, ...] = ()  # .json, .csv, .html paths

    def __post_init__(self) -> None:
        if self.load.slo_search and self.slo is None:
            raise InferlabError("--slo-search needs --slo")
        if self.load.slo_search and self.load.profile != "sweep":
            raise InferlabError("--slo-search runs on top of --profile sweep")
        for path in self.outputs:
            if Path(path).suffix not in REPORT_SUFFIXES:
                raise InferlabError(f"--output {path}: use a .json, .csv or .html name")
        # last, after every flag's own check: a missing default corpus is the setup's fault
        # and once hid the user's actual mistake (--workers 0, a missing --tokenizer)
        self.data.check_corpus()

"""`--compare-bench RESULT.json`: a measured `inferlab bench` result beside the planner's
prediction for the same workload, as measured / predicted ratios.

The reader is tolerant of the result's layout: it looks for runs (a list of dicts that carry a
TTFT figure, or the whole file as one run) and, in each, for numbers whose key path names the
metric (ttft / time_to_first_token, itl / inter_token / tpot, output throughput) and, for latency,
the median (p50 / median). Paths naming errors or cancelled requests are skipped.

A run is predicted at its measured mean concurrency where it has one (a concurrency cap only
bounds it), else at its request rate's (Little's law) or its concurrency setting. A run at a
request rate is predicted to deliver that rate, up to the replica's capacity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlab.errors import InferlabError
from inferlab.planner.capacity import ReplicaPoint, Workload, replica_point
from inferlab.planner.plan import Plan, batch_limit
from inferlab.user_files import parse_user_json, read_user_text

TTFT = re.compile(r"ttft|time_to_first_token")
ITL = re.compile(r"itl|inter_token|tpot|time_per_output_token")
THROUGHPUT = re.compile(r"output.*(throughput|tokens_per_s|tok_per_s|tps)|output_throughput")
MEDIAN = re.compile(r"^(p50|median|50|p50_ms|median_ms)$")
# failed requests, the bench's one-request "floor" baseline, latencies from intended send times
EXCLUDED = re.compile(r"error|cancel|fail|incomplete|aborted|floor|intended")
PROMPT = re.compile(r"^(mean_)?(prompt|input)_(tokens|len)(_mean)?$")
OUTPUT = re.compile(r"^(mean_)?(output|completion)_(tokens|len)(_mean)?$|^max_tokens$")
CONCURRENCY = re.compile(r"concurrency|num_streams|streams")
MEAN = re.compile(r"(^|[/_])(mean|avg|average)([/_]|$)")
RATE = re.compile(r"^(request_)?rate(_per_s)?$|^requests_per_s_target$")
# inferlab bench's closed-loop profiles: a stage's `rate` counts its streams, not requests/s
STREAM_PROFILES = ("synchronous", "concurrent", "throughput")


def _leaves(obj: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    """Numeric leaves of nested dicts with their lower-cased key paths (lists are not entered:
    they hold per-request samples or other runs)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, (*path, str(key).lower()))
    elif isinstance(obj, int | float) and not isinstance(obj, bool) and math.isfinite(obj):
        yield path, float(obj)  # NaN or 1e400 (inf) in a result is no figure


def _metric(run: dict[str, Any], name: re.Pattern[str], median: bool) -> float | None:
    for path, value in _leaves(run):
        if any(EXCLUDED.search(p) for p in path):
            continue
        hits = [i for i, p in enumerate(path) if name.search(p)]
        if not hits:
            continue
        rest = path[hits[0]:]
        if not median or re.search(r"p50|median", rest[0]) or any(MEDIAN.match(p) for p in rest[1:]):
            return value
    return None


def _setting(run: dict[str, Any], name: re.Pattern[str]) -> float | None:
    """A workload setting: a leaf whose own key matches, or that sits under such a key (a
    statistics dict: the mean, else the first number)."""
    found = [(path, value) for path, value in _leaves(run) if any(name.search(p) for p in path)
             and not any(EXCLUDED.search(p) for p in path)]
    for path, value in found:
        if name.search(path[-1]) or path[-1] in ("mean", "avg", "value"):
            return value
    return found[0][1] if found else None


def _measured_concurrency(run: dict[str, Any]) -> float | None:
    """The mean of the requests in flight, as measured (inferlab bench's concurrency_mean);
    unlike a concurrency cap, it is what the server saw."""
    return next((value for path, value in _leaves(run)
                 if CONCURRENCY.search(key := "/".join(path)) and MEAN.search(key)
                 and not any(EXCLUDED.search(p) for p in path)), None)


def _offered_rate(run: dict[str, Any]) -> float | None:
    """Requests/s the run sent, or None for a closed loop (a fixed number of streams)."""
    def kinds(obj: Any) -> Iterator[str]:
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key in ("kind", "profile") and isinstance(value, str):
                    yield value.lower()
                yield from kinds(value)

    return None if any(k in STREAM_PROFILES for k in kinds(run)) else _setting(run, RATE)


def find_runs(result: Any) -> list[dict[str, Any]]:
    """The runs in a bench result: dicts in a list that carry a TTFT figure, else the file itself."""
    def carries_ttft(obj: Any) -> bool:
        return isinstance(obj, dict) and any(TTFT.search(p) for path, _ in _leaves(obj) for p in path)

    if isinstance(result, dict):
        for value in result.values():
            if isinstance(value, list) and any(carries_ttft(v) for v in value):
                return [v for v in value if carries_ttft(v)]
    if isinstance(result, list):
        return [v for v in result if carries_ttft(v)]
    return [result] if carries_ttft(result) else []


@dataclass(frozen=True)
class Comparison:
    label: str  # the run: its concurrency or rate
    workload: Workload
    concurrency: int
    measured: dict[str, float | None]  # ttft_ms, itl_ms, output_tokens_per_s
    predicted: dict[str, float]

    def ratio(self, key: str) -> float | None:
        measured = self.measured.get(key)
        return None if measured is None else measured / self.predicted[key]


def _batch(limit: int, concurrency: float) -> int:
    return max(1, min(round(concurrency), limit))


def _run_limit(plan: Plan, workload: Workload) -> int:
    """The most sequences a run of this workload keeps decoding: memory, max_num_seqs and the
    step budget, for the run's prompts and replies (not the plan's --workload)."""
    fitting = plan.memory.max_sequences(workload.context_len)
    return batch_limit(plan.inputs.memory, fitting, workload)[0]


def _concurrency(plan: Plan, run: dict[str, Any], workload: Workload,
                 rate: float | None) -> tuple[int, str]:
    """Sequences decoding together: the run's measured mean concurrency, else from its request
    rate by Little's law (in flight = rate × time in system, iterated to a fixed point, within
    any concurrency cap), else its concurrency setting."""
    measured, setting = _measured_concurrency(run), _setting(run, CONCURRENCY)
    limit = _run_limit(plan, workload)
    if measured is not None:
        label = f"mean concurrency {measured:.3g}"
        return _batch(limit, measured), label if rate is None else f"rate {rate:g} req/s, {label}"
    if rate is None:
        if setting is None:
            return 1, "single stream (no concurrency or rate found)"
        return _batch(limit, setting), f"concurrency {setting:.3g}"
    cap = limit if setting is None else _batch(limit, setting)
    batch = 1
    for _ in range(20):
        point = _predict(plan, workload, batch)
        latency_s = (point.ttft_ms + (workload.output_tokens - 1) * point.itl_ms) / 1e3
        batch = max(1, min(round(rate * latency_s), cap))
    return batch, f"rate {rate:g} req/s"


def _predict(plan: Plan, workload: Workload, batch: int) -> ReplicaPoint:
    return replica_point(plan.cost, plan.inputs.hardware, workload, batch,
                         plan.inputs.memory.tensor_parallel, plan.inputs.memory.max_num_batched_tokens)


def compare(plan: Plan, result: Any) -> list[Comparison]:
    runs = find_runs(result)
    if not runs:
        raise InferlabError("--compare-bench: no run with a TTFT figure found in the result")
    comparisons = []
    for run in runs:
        prompt = _setting(run, PROMPT) or plan.inputs.workload.prompt_tokens
        output = _setting(run, OUTPUT) or plan.inputs.workload.output_tokens
        workload = Workload(max(1, round(prompt)), max(1, round(output)))
        if workload.context_len > plan.inputs.model.config.max_context:
            raise InferlabError(
                f"--compare-bench: a run of {workload.prompt_tokens} + {workload.output_tokens} tokens "
                f"exceeds {plan.inputs.model.name}'s maximum context of "
                f"{plan.inputs.model.config.max_context}: a result for another model?")
        rate = _offered_rate(run)
        batch, label = _concurrency(plan, run, workload, rate)
        point = _predict(plan, workload, batch)
        # a rate-limited run is served what it offers, up to the replica's capacity
        served = point.requests_per_s if rate is None else min(rate, point.requests_per_s)
        comparisons.append(Comparison(
            label=label, workload=workload, concurrency=batch,
            measured={"ttft_ms": _metric(run, TTFT, median=True),
                      "itl_ms": _metric(run, ITL, median=True),
                      "output_tokens_per_s": _metric(run, THROUGHPUT, median=False)},
            predicted={"ttft_ms": point.ttft_ms, "itl_ms": point.itl_ms,
                       "output_tokens_per_s": served * workload.output_tokens},
        ))
    return comparisons


def load_bench_result(path: Path) -> Any:
    text = read_user_text(path, "bench result (--compare-bench)")
    return parse_user_json(text, f"--compare-bench: {path}")


def render_comparisons(comparisons: list[Comparison]) -> str:
    lines = ["Measured (bench) vs predicted (planner)",
             f"  {'run':<48} {'metric':<20} {'measured':>10} {'predicted':>10} {'ratio':>7}"]
    for c in comparisons:
        label = f"{c.label}, {c.workload.prompt_tokens}+{c.workload.output_tokens} tok"
        for key in ("ttft_ms", "itl_ms", "output_tokens_per_s"):
            measured, ratio = c.measured[key], c.ratio(key)
            m_text = "n/a" if measured is None else f"{measured:,.2f}"
            r_text = "n/a" if ratio is None else f"{ratio:.2f}"
            lines.append(f"  {label:<48} {key:<20} {m_text:>10} {c.predicted[key]:>10,.2f} {r_text:>7}")
            label = ""
    return "\n".join(lines) + "\n"

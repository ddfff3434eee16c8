"""`inferlab bench compare`: runs side by side, relative changes, significance, a CI gate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferlab.bench.metrics import PER_REQUEST
from inferlab.bench.report_json import LoadedRun, LoadedStage
from inferlab.bench.significance import mann_whitney_u
from inferlab.bench.stats import STAT_NAMES
from inferlab.bench.summary import measured
from inferlab.errors import InferlabError

LATENCY_METRICS = ("ttft_ms", "ttft_intended_ms", "itl_ms", "tpot_ms", "e2e_ms",
                   "e2e_intended_ms")
THROUGHPUT_METRICS = ("request_throughput", "output_token_throughput",
                      "total_token_throughput", "goodput")
# what --fail-on-regression judges: typical and tail latency, and throughput
GATED_STATS = ("median", "p95")


@dataclass
class Row:
    stage: str
    metric: str
    stat: str  # a STAT_NAMES entry, or "" for throughput
    base: float | None
    other: float | None
    change: float | None  # (other - base) / base
    p_value: float | None  # Mann-Whitney over per-request samples (latencies only)
    lower_is_better: bool

    @property
    def worse_by(self) -> float | None:
        """How much worse `other` is, as a positive fraction (negative: better)."""
        if self.change is None:
            return None
        return self.change if self.lower_is_better else -self.change


@dataclass
class Comparison:
    base: LoadedRun
    other: LoadedRun
    rows: list[Row]


def pair_stages(base: LoadedRun, other: LoadedRun) -> list[tuple[LoadedStage, LoadedStage]]:
    """Stages with the same label; else, when both have as many stages, by position."""
    labels = {s.label: s for s in other.stages}
    if all(s.label in labels for s in base.stages):
        return [(s, labels[s.label]) for s in base.stages]
    if len(base.stages) == len(other.stages):
        return list(zip(base.stages, other.stages, strict=True))
    raise InferlabError(f"cannot pair the stages of {base.path} and {other.path}: different "
                        "labels and counts (compare runs of the same profile)")


def _change(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or base == 0:
        return None
    return (other - base) / abs(base)


def compare(base: LoadedRun, other: LoadedRun) -> Comparison:
    rows = []
    for a, b in pair_stages(base, other):
        label = a.label if a.label == b.label else f"{a.label} / {b.label}"
        for metric in LATENCY_METRICS:
            _, p = mann_whitney_u(_samples(a, metric), _samples(b, metric))
            p_value = None if math.isnan(p) else p
            for stat in STAT_NAMES:
                x = a.summary.metrics[metric]["ok"].get(stat)
                y = b.summary.metrics[metric]["ok"].get(stat)
                rows.append(Row(label, metric, stat, x, y, _change(x, y), p_value, True))
        for metric in THROUGHPUT_METRICS:
            x, y = getattr(a.summary, metric), getattr(b.summary, metric)
            rows.append(Row(label, metric, "", x, y, _change(x, y), None, False))
        x, y = _error_rate(a), _error_rate(b)
        rows.append(Row(label, "error_rate", "", x, y, _change(x, y), None, True))
    return Comparison(base, other, rows)


def _samples(stage: LoadedStage, metric: str) -> list[float]:
    fn = PER_REQUEST[metric]
    return [v for r in measured(stage.summary, stage.records)
            if r.outcome == "ok" and (v := fn(r)) is not None]


def _error_rate(stage: LoadedStage) -> float | None:
    finished = stage.summary.counts["ok"] + stage.summary.counts["error"]
    return stage.summary.counts["error"] / finished if finished else None


def regressions(comparison: Comparison, threshold_pct: float, alpha: float) -> list[Row]:
    """Gated rows worse by more than the threshold (and significant, for latencies)."""
    bad = []
    for row in comparison.rows:
        gated = (row.metric in LATENCY_METRICS and row.stat in GATED_STATS) or \
            row.metric in ("request_throughput", "output_token_throughput")
        worse = row.worse_by
        if not gated or worse is None or worse * 100 <= threshold_pct:
            continue
        if row.p_value is not None and row.p_value >= alpha:
            continue  # a latency change the samples cannot tell from noise
        bad.append(row)
    return bad

"""`inferlab bench compare`: runs side by side, relative changes, significance, a CI gate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferlab.bench.metrics import PER_REQUEST
from inferlab.bench.report_json import LoadedRun, LoadedStage
from inferlab.bench.significance import fisher_exact, percentile_difference_p
from inferlab.bench.stats import PERCENTILES, STAT_NAMES
from inferlab.bench.summary import ok_values
from inferlab.errors import InferlabError

LATENCY_METRICS = ("ttft_ms", "ttft_intended_ms", "itl_ms", "tpot_ms", "e2e_ms",
                   "e2e_intended_ms")
THROUGHPUT_METRICS = ("request_throughput", "output_token_throughput",
                      "total_token_throughput", "goodput")
# what --fail-on-regression judges: typical and tail latency, throughput, and failures
GATED_STATS = ("median", "p95")
GATED_THROUGHPUTS = ("request_throughput", "output_token_throughput", "goodput")
# percentiles, the median included, tested by a bootstrap of their own difference; mean,
# min and max are shown untested (and not gated)
BOOTSTRAPPED = dict(PERCENTILES)
# what a run asked besides its server and model, which an A/B compare is there to change:
# the goodput of two SLOs, or the latencies of two data specs, differ whatever the server
WORKLOAD_META = ("profile", "data", "slo")


@dataclass
class Row:
    stage: str
    metric: str
    stat: str  # a STAT_NAMES entry, or "" for throughput
    base: float | None
    other: float | None
    change: float | None  # (other - base) / base; other - base when `points`
    p_value: float | None  # the test of this row's own statistic; None: untested
    lower_is_better: bool
    points: bool = False  # a rate whose change is its rise in points (from 0, no ratio)

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
    warnings: list[str]  # what the two runs asked differently, when allowed to differ


def pair_stages(base: LoadedRun, other: LoadedRun) -> list[tuple[LoadedStage, LoadedStage]]:
    """Stages with the same label, when both runs have the same unique labels; else, when both
    have as many stages, by position (a label shared by two stages names neither). Every stage
    of either run has a partner, whichever run is the base."""
    labels = {s.label: s for s in other.stages}
    unique = len(labels) == len(other.stages) and \
        len({s.label for s in base.stages}) == len(base.stages)
    if unique and set(labels) == {s.label for s in base.stages}:
        return [(s, labels[s.label]) for s in base.stages]
    if len(base.stages) == len(other.stages):
        return list(zip(base.stages, other.stages, strict=True))
    raise InferlabError(f"cannot pair the stages of {base.path} and {other.path}: different "
                        "labels and counts (compare runs of the same profile)")


def _change(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or base == 0:
        return None
    return (other - base) / abs(base)


def _workload_differences(base: LoadedRun, other: LoadedRun,
                         pairs: list[tuple[LoadedStage, LoadedStage]]) -> list[str]:
    """What the runs asked differently: a WORKLOAD_META entry, or a paired stage's kind and
    asked rate, both named in its label (a sweep's constant rates are measured from the
    server, so there only the kind is asked)."""
    differences = [f"{key} {base.meta.get(key)!r} vs {other.meta.get(key)!r}"
                   for key in WORKLOAD_META if base.meta.get(key) != other.meta.get(key)]
    for a, b in pairs:
        asked_a, asked_b = _asked(base, a), _asked(other, b)
        if asked_a != asked_b:
            differences.append(f"stage {asked_a} vs {asked_b}")
    return differences


def _asked(run: LoadedRun, stage: LoadedStage) -> str:
    kind = stage.summary.info.kind
    return kind if run.meta.get("profile") == "sweep" and kind == "constant" else stage.label


def compare(base: LoadedRun, other: LoadedRun,
            allow_different_workloads: bool = False) -> Comparison:
    """Row by row; refuses runs of different workloads unless allowed, as their
    differences would be reported as the server's."""
    pairs = pair_stages(base, other)
    differences = "; ".join(_workload_differences(base, other, pairs))
    if differences and not allow_different_workloads:
        raise InferlabError(f"{base.path} and {other.path} ran different workloads "
                            f"({differences}): pass --allow-different-workloads to compare "
                            "them anyway")
    warnings = [f"{base.path} and {other.path} ran different workloads ({differences}): "
                "their changes are not the server's alone"] if differences else []
    rows = []
    for a, b in pairs:
        label = a.label if a.label == b.label else f"{a.label} / {b.label}"
        for metric in LATENCY_METRICS:
            rows += _latency_rows(label, metric, a, b)
        for metric in THROUGHPUT_METRICS:
            x, y = getattr(a.summary, metric), getattr(b.summary, metric)
            rows.append(Row(label, metric, "", x, y, _change(x, y), None, False))
        rows.append(_error_rate_row(label, a, b))
    return Comparison(base, other, rows, warnings)


def _latency_rows(label: str, metric: str, a: LoadedStage, b: LoadedStage) -> list[Row]:
    x, y = (ok_values(s.summary, s.records, PER_REQUEST[metric]) for s in (a, b))
    p_values = dict(zip(BOOTSTRAPPED, percentile_difference_p(x, y, list(BOOTSTRAPPED.values())),
                        strict=True))
    rows = []
    for stat in STAT_NAMES:
        p = p_values.get(stat)
        u = a.summary.metrics[metric]["ok"].get(stat)
        v = b.summary.metrics[metric]["ok"].get(stat)
        rows.append(Row(label, metric, stat, u, v, _change(u, v),
                        None if p is None or math.isnan(p) else p, True))
    return rows


def _error_rate_row(label: str, a: LoadedStage, b: LoadedStage) -> Row:
    """Failed / finished requests; its change is the rise in points, as a clean base
    (0 failures) has no ratio to change by."""
    (x_errors, x_finished), (y_errors, y_finished) = _errors(a), _errors(b)
    x = x_errors / x_finished if x_finished else None
    y = y_errors / y_finished if y_finished else None
    p = fisher_exact(x_errors, x_finished, y_errors, y_finished)
    return Row(label, "error_rate", "", x, y, None if x is None or y is None else y - x,
               None if math.isnan(p) else p, True, points=True)


def _errors(stage: LoadedStage) -> tuple[int, int]:
    counts = stage.summary.counts
    return counts["error"], counts["ok"] + counts["error"]


def regressions(comparison: Comparison, threshold_pct: float, alpha: float) -> list[Row]:
    """Gated rows worse by more than the threshold (percent, or points for the error
    rate) and, where the row has a test, significant at alpha."""
    bad = []
    for row in comparison.rows:
        gated = (row.metric in LATENCY_METRICS and row.stat in GATED_STATS) or \
            row.metric in GATED_THROUGHPUTS or row.metric == "error_rate"
        worse = row.worse_by
        if not gated or worse is None or worse * 100 <= threshold_pct:
            continue
        if row.p_value is not None and row.p_value >= alpha:
            continue  # a change the samples cannot tell from noise
        bad.append(row)
    return bad

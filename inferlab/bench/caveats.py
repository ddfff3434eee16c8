"""Run-wide warnings: things a reader of the numbers must know before trusting them."""

from __future__ import annotations

from inferlab.bench.metrics import dispatch_lag_ms
from inferlab.bench.runner import StageResult

RATE_TOLERANCE = 0.02  # achieved vs asked send rate
TOKEN_TOLERANCE = 0.02  # server usage vs tokenizer count, beyond one token
DISPATCH_LAG_WARN_MS = 5.0  # p99 lag above this means the client fell behind its schedule


def run_warnings(stages: list[StageResult], tokenizer: bool, forced_length: bool,
                 verbatim_prompts: int = 0) -> list[str]:
    """`forced_length`: every request asked for exactly max_tokens (ignore_eos).
    `verbatim_prompts`: how many distinct prompts the requests cycled through, each sent as
    written (a file's); 0 when every request is unique (tagged synthetic prompts)."""
    warnings: list[str] = []
    for stage in stages:
        label = stage.summary.info.label
        warnings += [f"{label}: {w}" for w in stage.summary.warnings]
        warnings += [f"{label}: {w}" for w in stage_warnings(stage, tokenizer, forced_length)]
    if verbatim_prompts:
        warnings += repeated_prompts(stages, verbatim_prompts)
    return warnings


def repeated_prompts(stages: list[StageResult], prompts: int) -> list[str]:
    """Where a file's prompt was sent more than once (fewer prompts than requests, or a
    stage after the first, which starts again from the first prompt), the server's prefix
    cache serves the repeat: its TTFT reads low. Request i sends prompt i % prompts."""
    sent = [r.index % prompts for stage in stages for r in stage.records
            if r.start_ns is not None]
    distinct = len(set(sent))
    if len(sent) == distinct:
        return []
    noun = "prompt" if distinct == 1 else "prompts"
    return [f"{distinct} {noun} for {len(sent)} requests: repeats are served from the "
            "server's prefix cache, which lowers their TTFT"]


def stage_warnings(stage: StageResult, tokenizer: bool, forced_length: bool) -> list[str]:
    """`forced_length`: every request was sent with ignore_eos, whatever its record says."""
    out = []
    summary, ok = stage.summary, [r for r in stage.records if r.outcome == "ok"]
    failed = [r for r in stage.records if r.outcome == "error"]
    if failed:  # the table only counts them: say why, or a wrong --model looks like a slow run
        out.append(f"{len(failed)} of {len(stage.records)} requests failed; the first: "
                   f"{failed[0].error}")
    floor = stage.floor
    if floor is not None and not floor.counts["ok"] and any(floor.counts.values()):
        out.append(f"the client floor measured nothing: none of its {sum(floor.counts.values())} "
                   "requests to the zero-latency mock succeeded")
    if summary.info.stop_reason == "max_error_rate":
        out.append("stopped early: the error rate passed --max-error-rate")
    if stage.spec.rate_based and summary.sent_rate and summary.scheduled_rate:
        error = summary.sent_rate / summary.scheduled_rate - 1
        if abs(error) > RATE_TOLERANCE:
            out.append(f"scheduled {summary.scheduled_rate:.4g} req/s but sent "
                       f"{summary.sent_rate:.4g} ({error:+.1%}); "
                       + _behind_because(stage, error))
    lag = summary.metrics["dispatch_lag_ms"]["ok"]
    if stage.spec.rate_based and lag.p99 is not None and lag.p99 > DISPATCH_LAG_WARN_MS:
        late = sum((dispatch_lag_ms(r) or 0) > DISPATCH_LAG_WARN_MS for r in stage.records)
        were = "request was" if late == 1 else "requests were"
        why = ", held by --max-concurrency" if cap_held_sends(stage) else ""
        out.append(f"{late} {were} sent more than {DISPATCH_LAG_WARN_MS:g} ms late{why} "
                   f"(p99 lag {lag.p99:.1f} ms); latency from the intended time shows the cost")
    no_usage = sum(r.output_tokens_source != "usage" for r in ok)
    if no_usage:
        out.append(f"{no_usage} of {len(ok)} successful requests had no usage in their stream; "
                   "their output tokens were counted from chunks")
    # each request sent with ignore_eos, whatever the others: without it, max_tokens is a
    # ceiling and stopping short of it is no fault
    forced = [r for r in ok if (forced_length or r.ignore_eos)
              and r.output_tokens_asked is not None]
    short = sum(r.output_tokens != r.output_tokens_asked for r in forced)
    if short:
        which = "" if len(forced) == len(ok) else " sent with ignore_eos"
        out.append(f"{short} of {len(forced)} successful requests{which} did not return the "
                   "asked number of output tokens (does the server honour ignore_eos?)")
    if tokenizer:
        out += _token_mismatch(ok)
    return out


def cap_held_sends(stage: StageResult) -> bool:
    """Whether --max-concurrency, not the client, held a rate stage's sends back: it was
    set and the requests in flight reached it."""
    cap = stage.spec.max_concurrency
    return (stage.spec.rate_based and cap is not None
            and stage.summary.concurrency_max >= cap)


def _behind_because(stage: StageResult, error: float) -> str:
    if error < 0 and cap_held_sends(stage):
        return (f"--max-concurrency {stage.spec.max_concurrency} held the sends back (the "
                "requests in flight reached it), not the client")
    return "the client could not keep the schedule"


def _token_mismatch(ok: list) -> list[str]:
    checked = [r for r in ok if r.tokenizer_output_tokens is not None
               and r.output_tokens_source == "usage"]
    bad = [r for r in checked if abs(r.tokenizer_output_tokens - r.output_tokens)
           > max(1, TOKEN_TOLERANCE * r.output_tokens)]
    if not bad:
        return []
    r = bad[0]
    return [f"{len(bad)} of {len(checked)} requests: the server's usage and the tokenizer "
            f"disagree on output tokens (e.g. usage {r.output_tokens}, tokenizer "
            f"{r.tokenizer_output_tokens}); is --tokenizer the served model's?"]

"""`inferlab bench`, `inferlab bench mock-server` and `inferlab bench compare`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from inferlab.bench.config import (
    PROFILES,
    BenchConfig,
    DataConfig,
    LoadConfig,
    MeasureConfig,
    Slo,
    Span,
    StageLimits,
    TargetConfig,
)
from inferlab.bench.mock import MockConfig
from inferlab.errors import InferlabError
from inferlab.key_values import key_value_items
from inferlab.user_files import is_user_file, parse_user_json, stat_user_path

if TYPE_CHECKING:
    from inferlab.bench.session import RunResult


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="load-test an OpenAI-compatible server (TTFT, ITL, throughput)",
        description="Load-test any OpenAI-compatible server. Subcommands: mock-server, "
                    "compare.")
    _add_run_arguments(bench)
    bench.set_defaults(func=run_bench)
    sub = bench.add_subparsers(dest="bench_command", metavar="{mock-server,compare}")
    mock = sub.add_parser("mock-server", help="a mock OpenAI server with injected latency")
    _add_mock_arguments(mock)
    mock.set_defaults(func=run_mock_server)
    cmp = sub.add_parser("compare", help="compare JSON reports; a CI regression gate")
    cmp.add_argument("runs", nargs="+", help="JSON reports; the first is the baseline")
    cmp.add_argument("--fail-on-regression", type=float, metavar="PCT",
                     help="exit 1 (2 where an --output page could not be written) if a "
                          "stage's median or p95 latency, or its request, "
                          "output-token or goodput throughput, is worse by more than PCT "
                          "percent, or its error rate rose by more than PCT points; latencies "
                          "and the error rate must also be significant at --alpha (median and "
                          "p95: a bootstrap of their difference, whose p never goes below what "
                          "the sample sizes allow; error rate: Fisher's exact test)")
    cmp.add_argument("--alpha", type=float, default=0.05, help="significance level")
    cmp.add_argument("--allow-different-workloads", action="store_true",
                     help="compare runs whose profile, rates asked, data or SLO differ; a "
                          "warning names what differs (by default compare refuses them)")
    cmp.add_argument("--output", action="append", default=[], metavar="PATH",
                     help="write the comparison to PATH (.html)")
    cmp.set_defaults(func=run_compare)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    # one helper per --help group, called in the order the groups are listed
    _add_target_args(p.add_argument_group("target"))
    _add_load_args(p.add_argument_group("load"))
    _add_limit_args(p.add_argument_group("limits per stage"))
    _add_data_args(p.add_argument_group("data"))
    _add_measure_output_args(p.add_argument_group("measurement and output"))


def _add_target_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--target", help="server base URL, e.g. http://127.0.0.1:8000 (an SDK-style .../v1 works too)")
    g.add_argument("--model", help="model name to ask for (default: the first listed)")
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    g.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    g.add_argument("--extra-body", metavar="JSON", help="fields merged into every request")
    g.add_argument("--continuous-usage", action="store_true",
                   help="ask for usage in every chunk (vLLM's continuous_usage_stats)")


def _add_load_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--profile", choices=PROFILES, default="sweep")
    g.add_argument("--rate", type=float, nargs="+", default=[],
                   help="req/s (constant, poisson) or streams (concurrent); several values "
                        "run one stage each (a sweep's stages: --sweep-size)")
    g.add_argument("--max-concurrency", type=int,
                   help="in-flight cap over all workers (constant, poisson, sweep; "
                        "throughput: its streams)")
    g.add_argument("--sweep-size", type=int, default=LoadConfig.sweep_size,
                   help="stages in a sweep, as guidellm's sweep_size: synchronous, throughput, "
                        "then SIZE - 2 constant rates evenly spaced up to the throughput rate "
                        "(>= 2; default %(default)s)")
    g.add_argument("--sweep-sync-seconds", type=float, default=LoadConfig.sync_max_seconds,
                   help="time bound of a sweep's synchronous stage (default: %(default)s)")
    g.add_argument("--ramp-up", type=float, default=LoadConfig.ramp_up_s, metavar="SECONDS",
                   help="start closed-loop streams (concurrent, throughput) spread over this "
                        "many seconds")
    g.add_argument("--seed", type=int, default=LoadConfig.seed)


def _add_limit_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-seconds", type=float)
    g.add_argument("--max-requests", type=int)
    g.add_argument("--max-error-rate", type=float)
    g.add_argument("--warmup", default="0",
                   help="seconds (5, 5s) or fraction (0.1, 10%%) of the stage: of its "
                        "requests where --max-requests alone bounds it (as guidellm), else "
                        "of its duration")
    g.add_argument("--cooldown", default="0", help="as --warmup, at the stage's end")
    g.add_argument("--drain-seconds", type=float, default=StageLimits.drain_seconds,
                   help="after --max-seconds, how long in-flight requests may finish")
    g.add_argument("--request-timeout", type=float, default=StageLimits.request_timeout_s)


def _add_data_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data", default=DataConfig.data,
                   help="synthetic spec (prompt_tokens=N,output_tokens=N[,_stdev,_min,_max]"
                        "[,prefix_tokens=N], or as a JSON object; _min/_max without _stdev: "
                        "uniform) or a file of prompts, sent verbatim: .jsonl, .json (rows "
                        "or ShareGPT), .csv, .txt (a prompt a line); a row's "
                        "output_tokens_count (or output_tokens) is sent with ignore_eos, "
                        "max_tokens as a ceiling; its system_prompt (or system, prefix) goes "
                        "before its text, or as chat's system message")
    g.add_argument("--data-file", help="text to cut synthetic prompts from "
                                       "(default: ../shared/data WikiText-2 test)")
    g.add_argument("--tokenizer", help="a tokenizer.json, or a model folder holding one "
                                       "(no Hub download): synthetic prompts of exact length "
                                       "(their unique tag counted in), exact prompt counts "
                                       "of file prompts, output cross-check")
    g.add_argument("--max-tokens", type=int, default=DataConfig.default_output_tokens,
                   help="max_tokens for file records that give no output length")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="force output lengths (default: on for synthetic data and file rows "
                        "with an output count)")


def _add_measure_output_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--slo", help="ttft_ms=N,itl_ms=N,tpot_ms=N,e2e_ms=N for goodput; "
                                 "ttft and e2e count from the intended send time; tpot_ms "
                                 "bounds the time per output token after the first, "
                                 "(last token - first token) / (output tokens - 1), as vLLM's "
                                 "--goodput tpot and guidellm do (the report's itl_ms; its "
                                 "tpot_ms column counts the first token's wait)")
    g.add_argument("--slo-search", action="store_true",
                   help="after a sweep, bisect for the highest rate meeting --slo at p95")
    g.add_argument("--slo-search-steps", type=int, default=LoadConfig.slo_search_steps)
    g.add_argument("--workers", type=int, help="client processes (default: auto)")
    g.add_argument("--calibration-seconds", type=float,
                   default=MeasureConfig.calibration_seconds,
                   help="per stage, replay against a zero-latency mock (0: skip)")
    g.add_argument("--scrape-interval", type=float, default=MeasureConfig.scrape_interval_s,
                   help="seconds between /metrics scrapes (0: off)")
    g.add_argument("--output", action="append", default=[], metavar="PATH",
                   help="write .json, .csv or .html (repeatable)")
    g.add_argument("--quiet", action="store_true", help="no live progress display")


def _add_mock_arguments(p: argparse.ArgumentParser) -> None:
    m = MockConfig
    p.add_argument("--host", default=m.host)
    p.add_argument("--port", type=int, default=m.port, help="0: any free port (printed)")
    p.add_argument("--model", default=m.model)
    p.add_argument("--ttft-ms", type=float, default=m.ttft_ms)
    p.add_argument("--itl-ms", type=float, default=m.itl_ms)
    p.add_argument("--tokens-per-chunk", type=int, default=m.tokens_per_chunk)
    p.add_argument("--default-max-tokens", type=int, default=m.default_max_tokens)
    p.add_argument("--max-model-len", type=int, default=m.max_model_len,
                   help="prompt words + max_tokens above it: HTTP 400, as vLLM answers")
    p.add_argument("--max-running", type=int, default=m.max_running, help="0: no limit")
    p.add_argument("--error-rate", type=float, default=m.error_rate)
    p.add_argument("--hang-rate", type=float, default=m.hang_rate)
    p.add_argument("--close-rate", type=float, default=m.close_rate)
    p.add_argument("--seed", type=int, default=m.seed)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if not args.target:
        raise InferlabError("inferlab bench needs --target URL (or a subcommand: "
                            "mock-server, compare)")
    return BenchConfig(
        target=TargetConfig(
            url=args.target, model=args.model, chat=args.endpoint == "chat",
            api_key=args.api_key, headers=_parse_headers(args.header),
            extra_body=_parse_extra_body(args.extra_body),
            continuous_usage=args.continuous_usage),
        load=LoadConfig(
            profile=args.profile, rates=tuple(args.rate), max_concurrency=args.max_concurrency,
            sweep_size=args.sweep_size, sync_max_seconds=args.sweep_sync_seconds,
            ramp_up_s=args.ramp_up, seed=args.seed, slo_search=args.slo_search,
            slo_search_steps=args.slo_search_steps),
        limits=StageLimits(
            max_seconds=args.max_seconds, max_requests=args.max_requests,
            max_error_rate=args.max_error_rate, warmup=Span.parse(args.warmup, "--warmup"),
            cooldown=Span.parse(args.cooldown, "--cooldown"),
            drain_seconds=args.drain_seconds, request_timeout_s=args.request_timeout),
        data=DataConfig(
            data=args.data, data_file=args.data_file,
            tokenizer=_tokenizer_file(args.tokenizer), force_length=args.ignore_eos,
            default_output_tokens=args.max_tokens, seed=args.seed),
        measure=MeasureConfig(
            workers=args.workers, calibration_seconds=args.calibration_seconds,
            scrape_interval_s=args.scrape_interval if args.scrape_interval != 0 else None),
        slo=None if args.slo is None else Slo.parse(args.slo),
        outputs=tuple(args.output))


def _parse_headers(items: list[str]) -> tuple[tuple[str, str], ...]:
    """--header NAME:VALUE pairs, stripped."""
    return tuple(key_value_items(items, "--header", "NAME:VALUE", sep=":", any_case=True).items())


def _parse_extra_body(text: str | None) -> tuple[tuple[str, object], ...]:
    """--extra-body's JSON object as (field, value) pairs; none given: ()."""
    if not text:
        return ()
    parsed = parse_user_json(text, "--extra-body")
    if not isinstance(parsed, dict):
        raise InferlabError("--extra-body must be a JSON object")
    return tuple(parsed.items())


def _tokenizer_file(path: str | None) -> str | None:
    """--tokenizer's tokenizer.json: the file, or the one in a model folder. The load tester
    reads local files only: a Hub model id is not downloaded."""
    found = None if path is None else stat_user_path(path)  # a name too long is no file
    if path is None or (found is not None and stat.S_ISREG(found.st_mode)):
        return path
    if found is not None and stat.S_ISDIR(found.st_mode):
        inside = Path(path) / "tokenizer.json"
        if not is_user_file(inside):
            raise InferlabError(f"--tokenizer {path}: the folder holds no tokenizer.json")
        return str(inside)
    raise InferlabError(f"--tokenizer {path}: no such file or folder (a tokenizer.json or a "
                        "model folder holding one; a Hub model id is not downloaded)")


def run_bench(args: argparse.Namespace) -> int:
    from inferlab.bench.console import print_summary, stdout_console
    from inferlab.bench.interrupts import Interrupts
    from inferlab.bench.outputs import check_output_paths, write_outputs
    from inferlab.bench.progress import LiveProgress, NullProgress
    from inferlab.bench.session import run_benchmark

    config = config_from_args(args)
    check_output_paths(config.outputs)  # before the run, so a typo does not lose it
    progress = NullProgress() if args.quiet else LiveProgress()
    with Interrupts().installed() as interrupts:  # a Ctrl-C from here on still writes the results
        result = run_benchmark(config, progress, interrupts)
        failed = _report_writes(write_outputs(result, config.outputs))  # first: stdout may close
        all_failed = _all_failed(result)
        if all_failed:
            print(f"error: {all_failed}", file=sys.stderr)
        code = 130 if result.interrupted else 2 if failed else 1 if all_failed else 0
        return _printed(lambda: print_summary(result, stdout_console()), code)


def _all_failed(result: RunResult) -> str | None:
    """Why the run measured nothing, when requests failed and none succeeded: a script or a CI
    job that only reads the exit code would take a run against a broken server for a
    measurement."""
    records = [r for stage in result.stages for r in stage.records]
    failed = [r for r in records if r.outcome == "error"]
    if not failed or any(r.outcome == "ok" for r in records):
        return None
    return f"every request failed ({len(failed)}); the first: {failed[0].error}"


def _report_writes(written: list[tuple[str, str | None]]) -> bool:
    """Says what was written and what could not be (on stderr); whether anything failed."""
    for path, error in written:
        print(f"wrote {path}" if error is None else f"error: {error}", file=sys.stderr)
    return any(error for _, error in written)


def run_mock_server(args: argparse.Namespace) -> int:
    from inferlab.bench.mock import MockServer

    config = MockConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MockConfig)})

    async def main() -> None:
        server = MockServer(config)
        print(f"mock server listening on {await server.start()}", flush=True)
        try:
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM
        finally:
            await server.close()

    try:
        asyncio.run(main())
    except OSError as e:
        raise InferlabError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from inferlab.bench.compare import compare, regressions
    from inferlab.bench.compare_report import failure_line, print_comparison, render_comparison_html
    from inferlab.bench.console import stdout_console
    from inferlab.bench.outputs import write_report
    from inferlab.bench.report_json import load_run

    _check_compare_args(args)
    runs = [load_run(path) for path in args.runs]
    comparisons = [compare(runs[0], other, args.allow_different_workloads) for other in runs[1:]]
    failures = []
    if args.fail_on_regression is not None:
        failures = [row for comparison in comparisons
                    for row in regressions(comparison, args.fail_on_regression, args.alpha)]
    page = render_comparison_html(comparisons, args.alpha, failures) if args.output else ""
    written = [(path, write_report(path, page, "compare --output")) for path in args.output]
    write_failed = _report_writes(written)  # before printing: stdout's reader may be gone

    def show() -> None:
        console = stdout_console()
        for comparison in comparisons:
            print_comparison(comparison, console, args.alpha)
        for row in failures:
            console.print(f"[red]{escape(failure_line(row))}[/]")

    return _printed(show, 2 if write_failed else 1 if failures else 0)


def _printed(show: Callable[[], None], code: int) -> int:
    """code, once show() has printed: a reader of stdout that left (`| head`) changes no
    verdict, a regression found or a run interrupted."""
    try:
        show()
    except BrokenPipeError:
        from inferlab.cli import silence_stdout

        silence_stdout()
    return code


def _check_compare_args(args: argparse.Namespace) -> None:
    from inferlab.bench.outputs import check_writable

    if len(args.runs) < 2:
        raise InferlabError("compare needs at least two JSON reports")
    threshold = args.fail_on_regression
    # a negative threshold would flag identical runs; NaN compares false to everything
    if threshold is not None and not 0 <= threshold < math.inf:
        raise InferlabError(f"--fail-on-regression must be a percentage >= 0, got {threshold}")
    if not 0 < args.alpha < 1:
        raise InferlabError(f"--alpha must be in (0, 1), got {args.alpha}")
    for path in args.output:
        if not path.endswith(".html"):
            raise InferlabError(f"compare --output {path}: use an .html name")
        check_writable(path, "compare --output")

"""Serving on this CPU: `inferlab serve` driven by `inferlab bench` vs transformers `generate`.

Workload W: the embedded model, ~300-token prompts cut from the WikiText-2 test text, 128 output
tokens (ignore_eos), through the HTTP server at 1, 4, 16 and 64 concurrent streams. Beside it, in
the same run, transformers `generate` with static batches of 16 on the same number of requests and
the same dtype. Prints output throughput, TTFT and ITL per concurrency, the ratios to transformers,
and the fraction of the machine's roofline each point reaches (`output_rate_bound`: every
request's prefill at the matmul peak, then its decode steps at the longer of the weights and the
streams' KV read at the bandwidth and the step's FLOPs at the peak); the single stream also
against its weights' bytes at the bandwidth re-measured just before and after each of its rounds
(issue 8's definition).

The two sides alternate in rounds (default 3: every concurrency through the server, then
transformers) and the figures are medians, each ratio the median of the rounds' ratios: this
machine's speed moves by tens of percent from minute to minute, and one sample of each side, a
few minutes apart, gave ratios 2.2-2.8x for the same build.

    .venv/bin/python benchmarks/cpu_serving.py [--concurrency 1 4 16 64] [--rounds 3] [--serve-args "--block-size 64"]
        [--dtype bfloat16] [--model DIR] [--skip-transformers]
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import torch
from offline_throughput import run_transformers
from workloads import (
    WIKITEXT,
    bytes_read_per_decode_step,
    exit_on_sigterm,
    machine_roofline,
    model_path,
    output_rate_bound,
    positive_int,
    rounds_text,
    script_parser,
    wikitext_prompts,
)

from inferlab.models.config import ModelConfig
from inferlab.planner.measure import stream_bandwidth_bytes_per_s

PROMPT_TOKENS, OUTPUT_TOKENS = 300, 128  # workload W (issue 8)

PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(port: int, dtype: str, max_seqs: int, model: str | None = None,
            extra: tuple[str, ...] = ()) -> Iterator[None]:
    """An `inferlab serve` on `port` while the block runs, stopped when it ends, however it
    ends (an error, Ctrl-C, SIGTERM through exit_on_sigterm)."""
    with tempfile.TemporaryFile() as log:  # a pipe nobody reads would fill and stall the server
        server = subprocess.Popen(
            [PYTHON, "-m", "inferlab.cli", "serve", *([model] if model else []), "--port", str(port),
             "--dtype", dtype, "--kv-cache-memory", "3GiB", "--max-num-seqs", str(max_seqs),
             "--max-model-len", "2048", *extra],
            stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_until_healthy(server, port, log)
            yield
        finally:
            server.terminate()
            try:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=60)
            finally:  # also when a second SIGTERM cut the wait short
                server.kill()  # one that ignored SIGTERM for a minute; nothing once it has exited
                server.wait()


def wait_until_healthy(server: subprocess.Popen, port: int, log: IO[bytes]) -> None:
    """Returns once /health answers; exits with the server's last stderr lines if it exits
    first (a bad --serve-args fails at once) or stays unhealthy for 300 s."""
    deadline = time.time() + 300
    while server.poll() is None and time.time() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    log.seek(0)
    tail = "".join(log.read().decode(errors="replace").splitlines(keepends=True)[-20:])
    why = ("did not become healthy in 300 s" if server.returncode is None
           else f"exited with code {server.returncode} before it was healthy")
    sys.exit(f"{tail}error: `inferlab serve` on port {port} {why} (its stderr ends above)")


def bench(port: int, concurrency: int, requests: int, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """extra: more `inferlab bench` options (e.g. --extra-body '{"temperature": 0}')."""
    subprocess.run(
        [PYTHON, "-m", "inferlab.cli", "bench", "--target", f"http://127.0.0.1:{port}",
         "--profile", "concurrent", "--rate", str(concurrency), "--max-requests", str(requests),
         "--data", f"prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}", "--data-file", str(WIKITEXT),
         "--max-seconds", "900", "--output", str(out), "--quiet", *extra],
        check=True, stdout=subprocess.DEVNULL)
    summary = json.loads(out.read_text())["stages"][0]["summary"]
    ok = summary["metrics"]
    return {"output_tok_s": summary["output_token_throughput"],
            "ttft_p50_ms": ok["ttft_ms"]["ok"]["median"], "itl_p50_ms": ok["itl_ms"]["ok"]["median"],
            "requests_ok": summary["counts"].get("ok", 0)}


def tokenizer_json(model: str | None, directory: Path) -> Path:
    """The served model's tokenizer.json, for `inferlab bench --tokenizer`: prompts of exactly
    PROMPT_TOKENS tokens, as the transformers side's are (bench's word rule alone gave 282.7 on
    average, 243-338, on SmolLM2's tokenizer)."""
    from inferlab.models.loader import load_tokenizer
    from inferlab.models.model_path import resolve_model_path

    path = directory / "tokenizer.json"
    load_tokenizer(resolve_model_path(model)).backend.save(str(path))
    return path


def bench_beside_roofline(port: int, concurrency: int, out: Path,
                          extra: tuple[str, ...] = ()) -> dict:
    """bench, and for a single stream the bandwidth roofline measured just before and just
    after it: this VM's bandwidth moves by up to 2x from minute to minute, so a roofline
    measured minutes earlier says little about the run's own minutes."""
    requests = max(2 * concurrency, 8)
    if concurrency != 1:
        return bench(port, concurrency, requests, out, extra)
    before = stream_bandwidth_bytes_per_s(repeats=2)
    result = bench(port, concurrency, requests, out, extra)
    return {**result, "bandwidth_bytes_per_s": (before + stream_bandwidth_bytes_per_s(repeats=2)) / 2}


def print_single_stream_roofline(results: list[dict], weight_bytes: int) -> None:
    """Each round's single-stream ITL against the roofline measured around it."""
    fractions = [weight_bytes / r["bandwidth_bytes_per_s"] * 1e3 / r["itl_p50_ms"] for r in results]
    print("single stream against the roofline measured around each round: "
          + " / ".join(f"{r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, ITL {r['itl_p50_ms']:.1f} ms, {f:.0%}"
                       for r, f in zip(results, fractions, strict=True))
          + f"; median {statistics.median(fractions):.0%}")


class Transformers:
    """transformers `generate` on the embedded model, loaded once, timed on the same requests."""

    def __init__(self, dtype: torch.dtype, requests: int) -> None:
        from transformers import AutoModelForCausalLM

        from inferlab.models.embedded import embedded_model_path
        from inferlab.models.loader import load_tokenizer

        path = embedded_model_path()
        self.tokenizer = load_tokenizer(path)  # the server's
        self.prompts = wikitext_prompts(self.tokenizer, requests, PROMPT_TOKENS)
        self.model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype).eval()

    def rate(self) -> float:
        """Output tokens per second with static batches of 16."""
        seconds = run_transformers(self.model, self.prompts, OUTPUT_TOKENS, 16, self.tokenizer.eos_token_id)
        return len(self.prompts) * OUTPUT_TOKENS / seconds


def step_bytes(model: str | None, dtype: str) -> tuple[int, ModelConfig]:
    """Bytes of weights one decode step reads, as the server holds them (packed or quantized),
    and the model's config."""
    from inferlab.engine.llm import LLM

    llm = LLM(model, dtype=dtype, kv_cache_memory="64MiB")  # the layers exactly as served
    return bytes_read_per_decode_step(llm.engine.loaded.model), llm.engine.model_config


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="alternating rounds of both sides; medians are reported")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--hf-requests", type=positive_int, default=32)
    parser.add_argument("--model", default=None, type=model_path,
                        help="a model or checkpoint directory (e.g. a W4A16 one) instead of the embedded model")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--serve-args", default="",
                        help="more `inferlab serve` options, e.g. '--block-size 64'")
    args = parser.parse_args()
    exit_on_sigterm()
    try:
        serve_args = tuple(shlex.split(args.serve_args))
    except ValueError as e:  # an unclosed quote
        parser.error(f"argument --serve-args: {e}")
    roof = machine_roofline()
    bandwidth = roof["memory_bandwidth_bytes_per_s"]
    peak = roof["peak_flops"]["bf16" if args.dtype == "bfloat16" else "fp32"]
    print(f"machine: {roof['cpu']}, {bandwidth / 1e9:.1f} GB/s, "
          f"{peak / 1e12:.2f} TFLOP/s {args.dtype}; medians of {args.rounds} alternating rounds")
    weight_bytes, cfg = step_bytes(args.model, args.dtype)
    print(f"model: {args.model or 'embedded'}, {weight_bytes / 1e6:.1f} MB of weights read per decode step")
    hf = None if args.skip_transformers else Transformers(getattr(torch, args.dtype), args.hf_requests)
    port = free_port()
    rounds: list[dict[int, dict]] = []
    hf_rates: list[float] = []
    with (serving(port, args.dtype, max(args.concurrency), args.model, serve_args),
          tempfile.TemporaryDirectory() as tmp):
        exact = ("--tokenizer", str(tokenizer_json(args.model, Path(tmp))))
        for r in range(args.rounds):
            rounds.append({c: bench_beside_roofline(port, c, Path(tmp) / f"c{c}.json", exact)
                           for c in args.concurrency})
            if hf is not None:
                hf_rates.append(hf.rate())
            print(f"round {r + 1}: " + ", ".join(f"c{c} {res['output_tok_s']:.1f}"
                                                 for c, res in rounds[-1].items())
                  + (f", transformers {hf_rates[-1]:.1f} output tok/s" if hf_rates else ""), flush=True)
    if 1 in args.concurrency:
        print_single_stream_roofline([rd[1] for rd in rounds], weight_bytes)
    for c in args.concurrency:
        tok_s, ttft, itl = (statistics.median(rd[c][key] for rd in rounds)
                            for key in ("output_tok_s", "ttft_p50_ms", "itl_p50_ms"))
        bound = output_rate_bound(cfg, weight_bytes, c, PROMPT_TOKENS, OUTPUT_TOKENS,
                                  getattr(torch, args.dtype).itemsize, bandwidth, peak)
        print(f"concurrency {c:3d}: {tok_s:7.1f} output tok/s, TTFT p50 {ttft:7.0f} ms, ITL p50 "
              f"{itl:6.1f} ms ({tok_s / bound:.0%} of the roofline's {bound:.0f} output tok/s)")
    if not hf_rates:
        return
    print(f"transformers generate, static batches of 16: {statistics.median(hf_rates):.1f} output tok/s")
    for c in args.concurrency:
        ratios = [rd[c]["output_tok_s"] / h for rd, h in zip(rounds, hf_rates, strict=True)]
        print(f"RATIO concurrency {c} / transformers: {statistics.median(ratios):.2f}x "
              f"(rounds {rounds_text(ratios, '.2f')})")


if __name__ == "__main__":
    main()

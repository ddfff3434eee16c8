"""What the HTTP server costs: 16 concurrent streams through `inferlab serve` vs the offline engine.

Same model (the embedded SmolLM2-135M), same engine options, the same 16 prompts of 256 tokens
cut from the WikiText-2 test text, 128 output tokens each (greedy, ignore_eos). The server runs
as its own process (as users run it) and is driven here over HTTP with streaming, 16 requests at
once; the offline engine (`LLM.generate`) gets the same 16 requests in this process, stepped
from a worker thread as the server's engine loop is (on a loaded 2-core machine, torch stepping
from the main thread was measured 3-5x slower than from a worker thread, which would flatter the
server). Rounds alternate offline / server so drift in the machine's load hits both. Goal: the
server keeps at least 90% of the offline throughput. Wall-clock ratios on a shared machine are
noisy (other jobs come and go), so it also compares CPU seconds per output token, which the
neighbours disturb far less, and shows the share of the server's event-loop thread.

    .venv/bin/python benchmarks/serve_overhead.py [--rounds 2] [--streams 16] [--dtype auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from workloads import positive_int, script_parser, thread_count, wikitext_prompts

from inferlab.config import DTYPES, parse_bytes
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError


def run_offline(llm: LLM, prompts: list[list[int]], output_tokens: int) -> tuple[float, list[str]]:
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_tokens for o in outs)
    return elapsed, [o.outputs[0].text for o in outs]


async def _stream_one(http: httpx.AsyncClient, url: str, prompt: list[int],
                      output_tokens: int) -> tuple[str, int]:
    body = {"prompt": prompt, "max_tokens": output_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    pieces, completion_tokens = [], 0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            sys.exit(f"server answered {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk["choices"]:
                pieces.append(chunk["choices"][0]["text"])
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
    return "".join(pieces), completion_tokens


async def run_server(url: str, prompts: list[list[int]], output_tokens: int) -> tuple[float, list[str]]:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(_stream_one(http, url, p, output_tokens) for p in prompts))
        elapsed = time.perf_counter() - start
    assert all(n == output_tokens for _, n in results), [n for _, n in results]
    return elapsed, [text for text, _ in results]


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def start_server(engine_args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli", "serve", "--port", "0",
                             *engine_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"at (http://\S+) ", line)
        if match:
            return proc, match.group(1)
    sys.exit(f"the server exited ({proc.wait()}) before printing its URL")


@dataclass
class Round:
    offline_s: float  # wall time of the offline run
    server_s: float  # wall time of the HTTP run
    offline_cpu_s: float  # CPU of this process during the offline run (the engine alone)
    server_cpu_s: float  # CPU of the server process during the HTTP run
    loop_cpu_s: float  # of which its main thread: the event loop (HTTP, JSON, SSE)
    same_texts: int  # requests whose greedy text came out identical on both paths


def run_round(llm_thread: ThreadPoolExecutor, llm: LLM, server: subprocess.Popen, url: str,
              prompts: list[list[int]], output_tokens: int) -> Round:
    cpu = time.process_time()
    offline_s, offline_texts = llm_thread.submit(run_offline, llm, prompts, output_tokens).result()
    offline_cpu_s = time.process_time() - cpu
    before = thread_cpu_s(server.pid)
    server_s, server_texts = asyncio.run(run_server(url, prompts, output_tokens))
    after = thread_cpu_s(server.pid)
    return Round(offline_s, server_s, offline_cpu_s,
                 server_cpu_s=sum(after.values()) - sum(before.get(t, 0.0) for t in after),
                 loop_cpu_s=after[server.pid] - before[server.pid],
                 same_texts=sum(a == b for a, b in zip(offline_texts, server_texts, strict=True)))


def report(rounds: list[Round], args: argparse.Namespace) -> None:
    tokens = args.streams * args.output_tokens
    print(f"serve overhead: {args.streams} streams x {args.prompt_tokens} prompt tokens -> "
          f"{args.output_tokens} output tokens, dtype {args.dtype}, {len(rounds)} rounds")
    print("| round | offline tok/s | server tok/s | server / offline |")
    print("|---|---|---|---|")
    for i, r in enumerate(rounds, 1):
        print(f"| {i} | {tokens / r.offline_s:.1f} | {tokens / r.server_s:.1f} | "
              f"{r.offline_s / r.server_s:.3f} |")
    ratio = statistics.median(r.offline_s / r.server_s for r in rounds)
    print(f"throughput, server / offline: median {ratio:.3f} (goal >= 0.90)")
    offline_cpu = sum(r.offline_cpu_s for r in rounds)
    server_cpu = sum(r.server_cpu_s for r in rounds)
    loop_cpu = sum(r.loop_cpu_s for r in rounds)
    per_k = 1000 / (tokens * len(rounds))
    print(f"CPU per 1000 output tokens: offline {offline_cpu * per_k:.2f} s, server process "
          f"{server_cpu * per_k:.2f} s (ratio {server_cpu / offline_cpu:.3f}); the server's event "
          f"loop (HTTP, JSON, SSE) took {loop_cpu / server_cpu:.1%} of its CPU")
    # in bf16 a different batch composition rounds differently, so long greedy texts may diverge
    print(f"greedy texts identical on both paths: {sum(r.same_texts for r in rounds)} / "
          f"{args.streams * len(rounds)}")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--streams", type=positive_int, default=16)
    parser.add_argument("--prompt-tokens", type=positive_int, default=256)
    parser.add_argument("--output-tokens", type=positive_int, default=128)
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument("--kv-cache-memory", default="512MiB")
    parser.add_argument("--num-threads", type=thread_count, default=None,
                        help="torch threads, both sides")
    args = parser.parse_args()
    try:
        parse_bytes(args.kv_cache_memory)
    except InferlabError as e:
        parser.error(f"argument --kv-cache-memory: {e}")

    engine_args = ["--dtype", args.dtype, "--kv-cache-memory", args.kv_cache_memory]
    if args.num_threads:
        engine_args += ["--num-threads", str(args.num_threads)]
    llm = LLM(None, dtype=args.dtype, kv_cache_memory=args.kv_cache_memory,
              num_threads=args.num_threads)
    prompts = wikitext_prompts(llm.tokenizer, args.streams, args.prompt_tokens)
    server, url = start_server(engine_args)
    llm_thread = ThreadPoolExecutor(max_workers=1)  # one long-lived thread, like the server's
    try:
        # warm-up: first forwards allocate and pick kernels
        llm_thread.submit(run_offline, llm, prompts[:2], 4).result()
        asyncio.run(run_server(url, prompts[:2], 4))
        rounds = [run_round(llm_thread, llm, server, url, prompts, args.output_tokens)
                  for _ in range(args.rounds)]
    finally:
        llm_thread.shutdown()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    report(rounds, args)


if __name__ == "__main__":
    main()

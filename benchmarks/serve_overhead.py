"""What the HTTP server costs: 16 concurrent streams through `inferlab serve` vs the offline engine.

Same model (the embedded SmolLM2-135M), same engine options, the same 16 prompts of 256 tokens
cut from the WikiText-2 test text, 128 output tokens each (greedy, ignore_eos). The server runs
as its own process (as users run it) and is driven here over HTTP with streaming, 16 requests at
once; the offline engine (`LLM.generate`) gets the same 16 requests in this process, stepped
from a worker thread as the server's engine loop is (on a loaded 2-core machine, torch stepping
from the main thread was measured 3-5x slower than from a worker thread, which would flatter the
server). Rounds alternate offline / server so drift in the machine's load hits both. Goal: the
server keeps at least 90% of the offline throughput.

    .venv/bin/python benchmarks/serve_overhead.py [--rounds 2] [--streams 16] [--dtype auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from workloads import wikitext_prompts

from inferlab.engine.llm_engine import LLM
from inferlab.engine.sampling_params import SamplingParams


def run_offline(llm: LLM, prompts: list[list[int]], output_tokens: int) -> tuple[float, list[str]]:
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-memory", default="512MiB")
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads, both sides")
    args = parser.parse_args()

    engine_args = ["--dtype", args.dtype, "--kv-cache-memory", args.kv_cache_memory]
    if args.num_threads:
        engine_args += ["--num-threads", str(args.num_threads)]
    llm = LLM(None, dtype=args.dtype, kv_cache_memory=args.kv_cache_memory,
              num_threads=args.num_threads)
    prompts = wikitext_prompts(llm.tokenizer, args.streams, args.prompt_tokens)
    server, url = start_server(engine_args)
    engine_thread = ThreadPoolExecutor(max_workers=1)  # one long-lived thread, like the server's

    def offline(batch: list[list[int]], output_tokens: int) -> tuple[float, list[str]]:
        return engine_thread.submit(run_offline, llm, batch, output_tokens).result()

    try:
        offline(prompts[:2], 4)  # warm-up: first forwards allocate and pick kernels
        asyncio.run(run_server(url, prompts[:2], 4))
        offline_s, server_s, same = [], [], 0
        for _ in range(args.rounds):
            elapsed, offline_texts = offline(prompts, args.output_tokens)
            offline_s.append(elapsed)
            elapsed, server_texts = asyncio.run(run_server(url, prompts, args.output_tokens))
            server_s.append(elapsed)
            same += sum(a == b for a, b in zip(offline_texts, server_texts, strict=True))
    finally:
        engine_thread.shutdown()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)

    tokens = args.streams * args.output_tokens
    offline_tps = [tokens / s for s in offline_s]
    server_tps = [tokens / s for s in server_s]
    print(f"serve overhead: {args.streams} streams x {args.prompt_tokens} prompt tokens -> "
          f"{args.output_tokens} output tokens, dtype {args.dtype}, {args.rounds} rounds")
    print("| path | output tok/s per round | mean |")
    print("|---|---|---|")
    for name, tps in (("offline LLM.generate", offline_tps), ("HTTP server, streaming", server_tps)):
        print(f"| {name} | {', '.join(f'{t:.1f}' for t in tps)} | {statistics.mean(tps):.1f} |")
    ratio = statistics.mean(server_tps) / statistics.mean(offline_tps)
    print(f"server / offline throughput: {ratio:.3f} (goal >= 0.90); per round: "
          f"{', '.join(f'{s / o:.3f}' for s, o in zip(server_tps, offline_tps, strict=True))}")
    # in bf16 a different batch composition rounds differently, so long greedy texts may diverge
    print(f"greedy texts identical on both paths: {same} / {args.rounds * args.streams}")


if __name__ == "__main__":
    main()

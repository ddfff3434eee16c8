"""Decode steps before and after the KV block pool has cycled: what a long-running CPU server sees.

A fresh engine hands out blocks in order, so a sequence's K/V lie front to back in the cache.
Once every block has been used and freed, blocks come from the LRU free queue in the order
earlier requests released them, and a decode step's attention reads scattered blocks. This
runs waves of 64 requests (WikiText-2 prompts of 300 tokens, 96 output tokens, ignore_eos)
through engines with a 1 GiB KV cache, one per block size, alternating wave by wave in one
process, and prints each wave's median decode-step time, the share of a running sequence's
consecutive blocks that are adjacent in the cache, and the last waves against the first.

    .venv/bin/python benchmarks/kv_steady_state.py [--block-sizes 16 128] [--waves 5]
"""

from __future__ import annotations

import statistics
import time

from workloads import bounded_int, positive_int, script_parser, wikitext_prompts

from inferlab.engine.llm import LLM
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.sampling_params import SamplingParams

REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 64, 300, 96


def adjacent_share(engine: LLMEngine) -> float:
    """Of the running sequences' consecutive block pairs, the share that are neighbours."""
    pairs = adjacent = 0
    for request in engine.scheduler.running:
        ids = request.block_ids
        pairs += len(ids) - 1
        adjacent += sum(b == a + 1 for a, b in zip(ids, ids[1:], strict=False))
    return adjacent / max(pairs, 1)


def wave(engine: LLMEngine, prompts: list[list[int]]) -> tuple[float, float]:
    """Median decode-step seconds of one wave, and the adjacent share halfway through it."""
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0)
    for prompt in prompts:
        engine.add_request(prompt, params)
    steps, share = [], 0.0
    while engine.has_unfinished_requests():
        decoding = not engine.scheduler.waiting and all(
            r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running)
        start = time.perf_counter()
        engine.step()
        if decoding:
            steps.append(time.perf_counter() - start)
            if len(steps) == OUTPUT_TOKENS // 2:
                share = adjacent_share(engine)
    return statistics.median(steps), share


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--block-sizes", type=positive_int, nargs="+", default=[16, 128],
                        help="KV block sizes, powers of two")
    parser.add_argument("--waves", type=bounded_int(2), default=5,
                        help="at least 2: the summary sets the waves run after the pool has cycled "
                             "against the first")
    args = parser.parse_args()
    if odd := [size for size in args.block_sizes if size & (size - 1)]:
        parser.error(f"argument --block-sizes: a block size is a power of two, not {odd[0]}")
    first = LLM(max_num_seqs=REQUESTS, kv_cache_memory="1GiB", block_size=args.block_sizes[0])
    engines = {args.block_sizes[0]: first.engine}
    for size in args.block_sizes[1:]:
        engines[size] = LLM(loaded=first.engine.loaded, max_num_seqs=REQUESTS, kv_cache_memory="1GiB",
                            block_size=size).engine
    tokenizer = first.engine.tokenizer
    blocks_per_wave = {size: REQUESTS * -(-(PROMPT_TOKENS + OUTPUT_TOKENS) // size) for size in engines}
    for size, engine in engines.items():
        print(f"block size {size}: {engine.num_kv_blocks} blocks, a wave takes {blocks_per_wave[size]}")
    results: dict[int, list[tuple[float, float]]] = {size: [] for size in engines}
    for w in range(args.waves):
        prompts = wikitext_prompts(tokenizer, REQUESTS, PROMPT_TOKENS, offset=w * REQUESTS)
        for size, engine in engines.items():
            results[size].append(wave(engine, prompts))
        print(f"wave {w}: " + ", ".join(
            f"block {size}: {results[size][-1][0] * 1e3:.1f} ms a decode step, "
            f"{results[size][-1][1]:.0%} adjacent" for size in engines), flush=True)
    for size, rows in results.items():
        cycled = [ms for w, (ms, _) in enumerate(rows)
                  if (w + 1) * blocks_per_wave[size] > engines[size].num_kv_blocks]
        if cycled:
            print(f"block {size}: waves after the pool cycled {statistics.median(cycled) * 1e3:.1f} ms "
                  f"against {rows[0][0] * 1e3:.1f} ms for the first: "
                  f"{statistics.median(cycled) / rows[0][0]:.2f}x")


if __name__ == "__main__":
    main()

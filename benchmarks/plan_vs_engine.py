"""Predicted vs measured decode step time of the embedded model on this machine.

In each of a few rounds, measures this CPU (the `cpu-local` micro-benchmark: one-row bf16 matmul
streaming, matmul rate, eager layer launch overhead) and times the engine's decode steps (in the
dtype its --dtype auto runs here: bf16 on CPUs with AVX512-BF16 or AMX, else fp32; all sequences
decoding) at batch 1 and 16, so both see the same machine. The planner's roofline
then predicts the step time from the best hardware figures of all rounds (what the machine can
do, as a datasheet would say), beside the engine's best and median step. The goal: the best step
within ±30% of the prediction. This machine is shared with other work: the median shows what
that costs; run it when the load average is low, or with --threads 1.

    .venv/bin/python benchmarks/plan_vs_engine.py [--rounds 5] [--steps 12] [--threads N]
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any

import torch
from workloads import positive_int, script_parser, thread_count

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.planner.budget import MemoryConfig, plan_memory
from inferlab.planner.cpu_local import cpu_local_hardware, planning_grid
from inferlab.planner.gguf_held import held_format
from inferlab.planner.measure import engine_dtype, measure_cpu
from inferlab.planner.memory import weight_bytes, weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.roofline import decode_step, model_cost

WARMUP_STEPS = 3  # after the prefill step: first decode steps warm caches and kernels


def time_decode_steps(llm: LLM, batch: int, prompt_len: int, steps: int, seed: int) -> list[float]:
    """Seconds of each engine step while `batch` sequences decode together."""
    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(max_tokens=WARMUP_STEPS + steps + 4, ignore_eos=True, temperature=0.0)
    for _ in range(batch):  # random prompts: no prefix-cache hits between them
        llm.engine.add_request([rng.randrange(100, vocab) for _ in range(prompt_len)], params)
    llm.engine.step()  # prefill of every prompt in one step (batch × prompt_len within budget)
    for _ in range(WARMUP_STEPS):
        llm.engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        outputs = llm.engine.step()
        times.append(time.perf_counter() - start)
        assert len(outputs) == batch, f"expected {batch} sequences decoding, got {len(outputs)}"
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return times


def best_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure at its best over the rounds: the least disturbed measurement."""
    return rounds[0] | {
        "memory_bandwidth_bytes_per_s": max(r["memory_bandwidth_bytes_per_s"] for r in rounds),
        "copy_bandwidth_bytes_per_s": max(r["copy_bandwidth_bytes_per_s"] for r in rounds),
        **{grid: {n: {w: max(r[grid][n][w] for r in rounds) for w in by_width}
                  for n, by_width in rounds[0][grid].items()}
           for grid in ("stream_bytes_per_s", "codes_stream_bytes_per_s") if grid in rounds[0]},
        "peak_flops": {k: max(r["peak_flops"][k] for r in rounds) for k in rounds[0]["peak_flops"]},
        "layer_overhead_s": min(r["layer_overhead_s"] for r in rounds),
    }


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=12,
                        help="timed decode steps per round and batch")
    parser.add_argument("--prompt-len", type=positive_int, default=32)
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads for both the micro-benchmark and the engine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    dtype = engine_dtype()  # the planner's weight format and the engine's run must agree
    fmt_name = "bf16" if dtype == torch.bfloat16 else "fp32"
    llm = LLM(model=None, dtype=str(dtype).removeprefix("torch."), kv_cache_memory="64MiB", max_num_seqs=max(args.batches),
              num_threads=args.threads)
    load_before = os.getloadavg()[0]
    rounds, steps = [], {b: [] for b in args.batches}
    for r in range(args.rounds):
        rounds.append(measure_cpu(repeats=1))
        for b in args.batches:
            steps[b] += time_decode_steps(llm, b, args.prompt_len, args.steps, seed=r * 1000 + b)
    figures = best_figures(rounds)

    spec = resolve_model(None)
    fmt = held_format(spec.source, fmt_name) or weight_format(fmt_name)  # as `inferlab plan` takes it
    hw = cpu_local_hardware(figures, codes=bool(fmt.gguf_types))
    weights = weight_bytes(spec.config, fmt)
    memory = plan_memory(spec.config, weights, MemoryConfig(hw.memory_bytes, kv_cache_bytes=64 * 2**20))
    cost = model_cost(spec.config, weights, fmt, memory, tp=1)
    context = args.prompt_len + WARMUP_STEPS + args.steps // 2  # mean context of the timed steps

    print(f"cpu-local: {figures['cpu']}, {figures['threads']} threads, load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; best of {args.rounds} rounds:")
    grid = planning_grid(figures, bool(fmt.gguf_types))  # the rates hw plans with
    for rows, by_width in figures[grid].items():
        curve = ", ".join(f"{w}: {b / 1e9:.1f}" for w, b in by_width.items())
        print(f"  {rows:>2}-row {'codes' if grid.startswith('codes') else 'matmul'} stream GB/s by width {curve}; "
              f"at {spec.config.hidden_size}: "
              f"{hw.bandwidth_for(spec.config.hidden_size, int(rows)) / 1e9:.1f}")
    print(f"  (copy "
          f"{figures['copy_bandwidth_bytes_per_s'] / 1e9:.1f}), bf16 matmul "
          f"{figures['peak_flops']['bf16'] / 1e9:.0f} GFLOP/s, fp32 {figures['peak_flops']['fp32'] / 1e9:.0f}"
          f", layer launch {figures['layer_overhead_s'] * 1e6:.0f} µs")
    print(f"embedded SmolLM2-135M, {fmt_name} ({fmt.name} weights), {weights.total_bytes:,} weight bytes; prompt {args.prompt_len} "
          f"tokens, {args.rounds} × {args.steps} timed steps per batch, mean context {context}")
    print(f"{'batch':>6} {'predicted ms':>13} {'(memory':>8} {'compute':>8} {'launch)':>8} "
          f"{'best ms':>8} {'median ms':>10} {'ratio best':>11} {'ratio median':>13}")
    for batch, times in steps.items():
        step = decode_step(cost, hw, batch, context)
        best, median = min(times), statistics.median(times)
        ratio = best / step.time_s
        verdict = "within ±30%" if 0.7 <= ratio <= 1.3 else "OUTSIDE ±30%"
        print(f"{batch:>6} {step.time_s * 1e3:>13.2f} {step.memory_s * 1e3:>8.2f} "
              f"{step.compute_s * 1e3:>8.2f} {step.overhead_s * 1e3:>8.2f} {best * 1e3:>8.2f} "
              f"{median * 1e3:>10.2f} {ratio:>11.2f} {median / step.time_s:>13.2f}  {verdict}")


if __name__ == "__main__":
    main()

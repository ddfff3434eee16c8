"""Predicted vs measured decode step time of the embedded model on this machine.

Measures this CPU's memory bandwidth and matmul rate (the `cpu-local` micro-benchmark) before and
after running the engine, predicts the decode step time at batch 1 and 16 with the planner's
roofline from their mean, and times the engine's decode steps (bf16, all sequences decoding).
Prints both and the ratio measured / predicted; the goal is 0.7-1.3. This machine is shared:
run it when it is otherwise idle (see the load average), or with --threads 1.

    .venv/bin/python benchmarks/plan_vs_engine.py [--steps 30] [--prompt-len 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from inferlab.engine.llm_engine import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.planner.budget import MemoryConfig, plan_memory
from inferlab.planner.measure import cpu_local_hardware, measure_cpu
from inferlab.planner.memory import weight_bytes, weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.roofline import decode_step, model_cost

MEAN_KEYS = ("memory_bandwidth_bytes_per_s", "copy_bandwidth_bytes_per_s", "layer_overhead_s")
WARMUP_STEPS = 3  # after the prefill step: first decode steps warm caches and kernels


def time_decode_steps(llm: LLM, batch: int, prompt_len: int, steps: int) -> list[float]:
    """Seconds of each engine step while `batch` sequences decode together."""
    rng = random.Random(batch)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both the micro-benchmark and the engine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    before = measure_cpu()
    llm = LLM(model=None, dtype="bfloat16", kv_cache_memory="64MiB", max_num_seqs=max(args.batches),
              num_threads=args.threads)
    measured = {b: time_decode_steps(llm, b, args.prompt_len, args.steps) for b in args.batches}
    after = measure_cpu()

    figures = before | {k: (before[k] + after[k]) / 2 for k in MEAN_KEYS} | {
        "peak_flops": {k: (before["peak_flops"][k] + after["peak_flops"][k]) / 2
                       for k in before["peak_flops"]}}
    hw = cpu_local_hardware(figures)
    spec = resolve_model(None)
    fmt = weight_format("bf16")
    weights = weight_bytes(spec.config, fmt)
    memory = plan_memory(spec.config, weights, MemoryConfig(hw.memory_bytes, kv_cache_bytes=64 * 2**20))
    cost = model_cost(spec.config, weights, fmt, memory, tp=1)
    context = args.prompt_len + WARMUP_STEPS + args.steps // 2  # mean context of the timed steps

    print(f"cpu-local: {figures['cpu']}, {figures['threads']} threads")
    for name, fig in (("before", before), ("after", after)):
        print(f"  {name:<6} matmul stream {fig['memory_bandwidth_bytes_per_s'] / 1e9:5.1f} GB/s "
              f"(copy {fig['copy_bandwidth_bytes_per_s'] / 1e9:5.1f}), bf16 matmul "
              f"{fig['peak_flops']['bf16'] / 1e9:5.0f} GFLOP/s, fp32 {fig['peak_flops']['fp32'] / 1e9:4.0f}"
              f", layer launch {fig['layer_overhead_s'] * 1e6:4.0f} µs")
    print(f"embedded SmolLM2-135M, bf16, {weights.total_bytes:,} weight bytes; "
          f"prompt {args.prompt_len} tokens, {args.steps} timed steps, mean context {context}")
    # the hardware figures are bests of a few runs (what the machine can do); the engine's
    # fastest step is the comparable figure, its median shows what other load costs
    print(f"{'batch':>6} {'predicted ms':>13} {'(memory':>8} {'compute':>8} {'launch)':>8} "
          f"{'best ms':>8} {'median ms':>10} {'ratio best':>11} {'ratio median':>13}")
    for batch, times in measured.items():
        step = decode_step(cost, hw, batch, context)
        best, median = min(times), statistics.median(times)
        ratio = best / step.time_s
        verdict = "within ±30%" if 0.7 <= ratio <= 1.3 else "OUTSIDE ±30%"
        print(f"{batch:>6} {step.time_s * 1e3:>13.2f} {step.memory_s * 1e3:>8.2f} "
              f"{step.compute_s * 1e3:>8.2f} {step.overhead_s * 1e3:>8.2f} {best * 1e3:>8.2f} "
              f"{median * 1e3:>10.2f} {ratio:>11.2f} {median / step.time_s:>13.2f}  {verdict}")


if __name__ == "__main__":
    main()

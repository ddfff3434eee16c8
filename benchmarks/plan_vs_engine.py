"""Predicted vs measured decode step time of the embedded model on this machine.

Measures this CPU's memory bandwidth and matmul rate (the `cpu-local` micro-benchmark) before and
after running the engine, predicts the decode step time at batch 1 and 16 with the planner's
roofline from their mean, and times the engine's decode steps (bf16, all sequences decoding).
Prints both and the ratio measured / predicted; the goal is 0.7-1.3.

    .venv/bin/python benchmarks/plan_vs_engine.py [--steps 30] [--prompt-len 32]
"""

from __future__ import annotations

import argparse
import random
import time

from inferlab.engine.llm_engine import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.planner.budget import MemoryConfig, plan_memory
from inferlab.planner.measure import cpu_local_hardware, measure_cpu
from inferlab.planner.memory import weight_bytes, weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.roofline import decode_step, model_cost

WARMUP_STEPS = 3  # after the prefill step: first decode steps warm caches and kernels


def time_decode_steps(llm: LLM, batch: int, prompt_len: int, steps: int) -> float:
    """Mean seconds per engine step while `batch` sequences decode together."""
    rng = random.Random(batch)
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(max_tokens=WARMUP_STEPS + steps + 4, ignore_eos=True, temperature=0.0)
    for _ in range(batch):  # random prompts: no prefix-cache hits between them
        llm.engine.add_request([rng.randrange(100, vocab) for _ in range(prompt_len)], params)
    llm.engine.step()  # prefill of every prompt in one step (batch × prompt_len within budget)
    for _ in range(WARMUP_STEPS):
        llm.engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        outputs = llm.engine.step()
        assert len(outputs) == batch, f"expected {batch} sequences decoding, got {len(outputs)}"
    elapsed = time.perf_counter() - start
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()

    before = measure_cpu()
    llm = LLM(model=None, dtype="bfloat16", kv_cache_memory="64MiB", max_num_seqs=max(args.batches))
    measured = {b: time_decode_steps(llm, b, args.prompt_len, args.steps) for b in args.batches}
    after = measure_cpu()

    figures = before | {
        "memory_bandwidth_bytes_per_s": (before["memory_bandwidth_bytes_per_s"]
                                         + after["memory_bandwidth_bytes_per_s"]) / 2,
        "peak_flops": {k: (before["peak_flops"][k] + after["peak_flops"][k]) / 2
                       for k in before["peak_flops"]},
    }
    hw = cpu_local_hardware(figures)
    spec = resolve_model(None)
    fmt = weight_format("bf16")
    weights = weight_bytes(spec.config, fmt)
    memory = plan_memory(spec.config, weights, MemoryConfig(hw.memory_bytes, kv_cache_bytes=64 * 2**20))
    cost = model_cost(spec.config, weights, fmt, memory, tp=1)
    context = args.prompt_len + WARMUP_STEPS + args.steps // 2  # mean context of the timed steps

    print(f"cpu-local: {figures['cpu']}, {figures['threads']} threads")
    for name, fig in (("before", before), ("after", after)):
        print(f"  {name:<6} bandwidth {fig['memory_bandwidth_bytes_per_s'] / 1e9:6.1f} GB/s, "
              f"bf16 matmul {fig['peak_flops']['bf16'] / 1e9:6.0f} GFLOP/s, "
              f"fp32 {fig['peak_flops']['fp32'] / 1e9:5.0f} GFLOP/s")
    print(f"embedded SmolLM2-135M, bf16, {weights.total_bytes:,} weight bytes; "
          f"prompt {args.prompt_len} tokens, {args.steps} timed steps, mean context {context}")
    print(f"{'batch':>6} {'predicted ms':>13} {'measured ms':>12} {'ratio':>7}  bound")
    for batch, seconds in measured.items():
        step = decode_step(cost, hw, batch, context)
        ratio = seconds / step.time_s
        verdict = "within ±30%" if 0.7 <= ratio <= 1.3 else "OUTSIDE ±30%"
        print(f"{batch:>6} {step.time_s * 1e3:>13.2f} {seconds * 1e3:>12.2f} {ratio:>7.2f}  "
              f"{step.bound}  {verdict}")


if __name__ == "__main__":
    main()

"""Where a decode step's time goes: torch profiler over engine steps at a given batch size.

    .venv/bin/python benchmarks/profile_decode.py --batch 1 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

from torch.profiler import profile
from workloads import positive_int

from inferlab.config import DTYPES
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--context", type=positive_int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--steps", type=positive_int, default=20)
    args = parser.parse_args()
    engine = LLM(dtype=args.dtype, kv_cache_memory="2GiB").engine
    params = SamplingParams(temperature=0, max_tokens=4 * args.steps + 8, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request([(7 * i + j) % 40000 + 100 for j in range(args.context)], params)
    while any(r.num_computed_tokens < r.num_tokens - 1 for r in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    print(f"batch {args.batch}, context {args.context}, {args.dtype}: {step_ms:.1f} ms per decode step "
          f"({args.batch / step_ms * 1e3:.0f} tok/s)")
    with profile() as prof:
        for _ in range(args.steps // 2):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()

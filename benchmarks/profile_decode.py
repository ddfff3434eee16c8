"""Where a decode step's time goes, at a given batch size and context: the engine's decode steps
timed, then timed again split among the engine's parts (the scheduler, the model's forward, the
logits, sampling, output processing, the rest), each from Python around the engine's own calls.

The forward runs the model in C (inferlab/kernels/cpu/model_forward.c: the linears, attention
and norms of every layer) as one call, which torch.profiler and cProfile see as one opaque op:
to see inside it, sample the process with perf while it runs many steps, e.g.
`perf record -g -p PID` (BENCHMARKS.md quotes such splits). On the CPU a
step is synchronous, so each part's time is its own.

    .venv/bin/python benchmarks/profile_decode.py --batch 1 --dtype bfloat16
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workloads import positive_int, script_parser

from inferlab.config import DTYPES
from inferlab.engine.llm import LLM
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.sampling_params import SamplingParams
from inferlab.models.loader import read_model_config
from inferlab.models.model_path import resolve_model_path
from inferlab.planner.memory import kv_cache_bytes_per_token

BLOCK_SIZE = 16
PARTS = {  # part -> what it is, as printed
    "scheduler": "scheduler (schedule, update)",
    "forward": "forward (the model, in C)",
    "logits": "logits (lm_head)",
    "sampling": "sampling",
    "outputs": "output processing",
}


def timed(seconds: dict[str, float], part: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """`call`, adding the seconds of each call to seconds[part]."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            seconds[part] += time.perf_counter() - start
    return wrapper


def split_steps(engine: LLMEngine, steps: int) -> tuple[float, dict[str, float]]:
    """Seconds of `steps` engine steps, and of each part of theirs: the engine's calls are wrapped
    in timers on this engine's objects only (a few microseconds a step)."""
    seconds = dict.fromkeys(PARTS, 0.0)
    runner, model, scheduler = engine.runner, engine.runner.model, engine.scheduler
    scheduler.schedule = timed(seconds, "scheduler", scheduler.schedule)
    scheduler.update_from_output = timed(seconds, "scheduler", scheduler.update_from_output)
    model.forward = timed(seconds, "forward", model.forward)
    model.compute_logits = timed(seconds, "logits", model.compute_logits)
    runner._sample = timed(seconds, "sampling", runner._sample)  # the logits inside, taken out below
    engine.outputs.process = timed(seconds, "outputs", engine.outputs.process)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds["sampling"] -= seconds["logits"]
    return time.perf_counter() - start, seconds


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--context", type=positive_int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--steps", type=positive_int, default=20)
    args = parser.parse_args()
    output_tokens = 4 * args.steps + 8  # past every step below: no request ends while timed
    cfg = read_model_config(resolve_model_path(None))
    if args.context + output_tokens > cfg.max_context:
        parser.error(f"argument --context: the model's context holds {cfg.max_context} tokens, "
                     f"{output_tokens} of them output: at most {cfg.max_context - output_tokens}, got {args.context}")
    # every request's blocks at once (fp32's 4 bytes, the widest), else the batch would run smaller
    per_sequence = -(-(args.context + output_tokens) // BLOCK_SIZE) * BLOCK_SIZE
    kv_bytes = args.batch * per_sequence * kv_cache_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 4)
    engine = LLM(dtype=args.dtype, kv_cache_memory=max(kv_bytes, 2 << 30), block_size=BLOCK_SIZE).engine
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request([(7 * i + j) % 40000 + 100 for j in range(args.context)], params)
    while any(r.num_computed_tokens < r.num_tokens - 1 for r in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    if len(engine.scheduler.running) != args.batch:
        raise SystemExit(f"error: {len(engine.scheduler.running)} of the {args.batch} requests run together")
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    print(f"batch {args.batch}, context {args.context}, {args.dtype}: {step_ms:.1f} ms per decode step "
          f"({args.batch / step_ms * 1e3:.0f} tok/s)")
    steps = max(args.steps // 2, 1)
    total, seconds = split_steps(engine, steps)
    print(f"split of {steps} more steps, timed around the engine's calls "
          f"({total / steps * 1e3:.1f} ms a step):")
    rest = total - sum(seconds.values())
    for what, part_s in [*((PARTS[p], s) for p, s in seconds.items()),
                         ("the rest (inputs, attention metadata, counters)", rest)]:
        print(f"  {what:48s} {part_s / steps * 1e3:7.2f} ms {part_s / total:6.1%}")
    print("the forward is one C call, opaque to torch.profiler: `perf record -g -p PID` sees inside it")


if __name__ == "__main__":
    main()

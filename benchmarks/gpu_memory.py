"""Step 6 of gpu.py: an engine sizing its own KV cache from --gpu-memory-utilization (the
profile run, which every other engine of the script skips by being told its cache's bytes), then
the same engine dropped: the memory it used and gave back."""

from __future__ import annotations

import gc
import weakref

import torch
from gpu_models import make_engine, random_workload, run_engine
from gpu_report import Report, Settings

from inferlab.engine.platform import available_memory_bytes
from inferlab.models.loader import LoadedModel
from inferlab.planner.measure import physical_memory_bytes

UTILIZATION = 0.5
# What the profile run does not see: the CUDA graphs' pool and workspaces, allocator rounding.
MEMORY_SLACK_BYTES = 2 * 2**30


def memory_in_use(device: torch.device) -> tuple[int, int]:
    """(used, total) bytes: the GPU's as CUDA reports them (every process, the CUDA context
    included); on the smoke run the host's, where nothing is checked."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total - free, total
    total = physical_memory_bytes()
    return total - (available_memory_bytes(device) or 0), total


def memory_section(s: Settings, report: Report, loaded: LoadedModel) -> None:
    """The engine sizing its own KV cache (engine/memory_profile.py's profile run), which every
    other engine here skips by being told its cache's bytes; then the same engine dropped."""
    gib = 2**30
    before, total = memory_in_use(s.device)
    # CPU (the smoke run): no profile path, and a CPU engine's default cache is 2 GiB
    kv = None if s.device.type == "cuda" else 2**26
    engine = make_engine(loaded, "bfloat16", s.device, kv, 256, 2048,
                         gpu_memory_utilization=UTILIZATION)
    kv_bytes = engine.num_kv_blocks * engine.config.block_size * engine.kv_bytes_per_token
    # one full step (max_num_batched_tokens of prompt) so that its activations count too
    run_engine(engine, random_workload(16, (512, 512), (2, 2), loaded.config.vocab_size, 5),
               s.device)
    used, _ = memory_in_use(s.device)
    limit = UTILIZATION * total + MEMORY_SLACK_BYTES
    report.add("memory", f"KV cache chosen for --gpu-memory-utilization {UTILIZATION:g}",
               kv_bytes / gib, "GiB")
    report.add("memory", f"device memory used before the engine, of {total / gib:.1f} GiB",
               before / gib, "GiB")
    report.add("memory", "device memory used with the engine, after a full step", used / gib,
               "GiB")
    report.target("memory", f"used <= {UTILIZATION:g} x total + {MEMORY_SLACK_BYTES / gib:g} "
                  "GiB slack", used <= limit, f"{used / gib:.1f} <= {limit / gib:.1f} GiB")
    # Reference counting alone must free it: LLMEngine gc.freeze()s, so the collector would not.
    gc.disable()
    try:
        engine_ref = weakref.ref(engine)
        del engine
        freed = engine_ref() is None
    finally:
        gc.enable()
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    after, _ = memory_in_use(s.device)
    report.check("memory", "a dropped engine is freed by reference counting", freed,
                 "freed" if freed else "still referenced: a reference cycle")
    report.add("memory", "device memory used once the engine is dropped", after / gib, "GiB")
    report.target("memory", "the dropped engine's memory is back",
                  after - before <= MEMORY_SLACK_BYTES,
                  f"{(after - before) / gib:+.2f} GiB against before it")


if __name__ == "__main__":
    raise SystemExit("a section of benchmarks/gpu.py, not a script: run benchmarks/gpu.py --help")

"""`--hardware cpu-local`: this machine's memory bandwidth and matmul rate, measured once with a
short PyTorch micro-benchmark and cached as JSON. The only planner module that touches torch,
and only inside `measure_cpu`.

Three things set a CPU decode step, so three are measured:
- the rate one-row bf16 matmuls stream weights from DRAM: decode's memory roof (a plain copy
  is measured too, and shown, but the matmul kernel is what decode waits on);
- the square-matmul rate in bf16 and fp32: the compute roof (prefill);
- the fixed host time of one small torch operator: an eager engine launches thousands per step
  (GPU servers hide this with CUDA graphs), which for a small model is a good share of the step.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inferlab.errors import InferlabError
from inferlab.planner.hardware import CPU_LOCAL, Hardware

DEFAULT_CACHE_PATH = Path.home() / ".cache" / "inferlab" / "cpu-local.json"
COPY_BYTES = 256 * 2**20  # far beyond any CPU cache, so the copy streams from DRAM
STREAM_MATRICES = 32  # 2048 × 2048 bf16 each: 256 MiB of weights, beyond any cache
MATMUL_N = {"bf16": 2048, "fp32": 1024}  # square sizes that take tens of ms each
SMALL_OPS = 200  # rounds of the small-operator mix
MEASURED_KEYS = ("memory_bandwidth_bytes_per_s", "peak_flops", "op_overhead_s", "memory_bytes")
CPU_RUNTIME_OVERHEAD_BYTES = 2**29  # the Python process with torch loaded


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm up: page faults, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _stream_bytes_per_s(repeats: int) -> float:
    """Weight bytes per second that one-row bf16 matmuls read, as in a decode step."""
    import torch
    import torch.nn.functional as F

    weights = [torch.randn(2048, 2048, dtype=torch.bfloat16) for _ in range(STREAM_MATRICES)]
    x = torch.randn(1, 2048, dtype=torch.bfloat16)  # [1, in]
    seconds = _best_seconds(lambda: [F.linear(x, w) for w in weights], repeats)
    return sum(w.numel() * w.element_size() for w in weights) / seconds


def _op_overhead_s(repeats: int) -> float:
    """Seconds per operator on a tiny tensor: dispatch, allocation and threading, no data."""
    import torch

    x = torch.randn(1, 64, dtype=torch.bfloat16)  # [1, 64]

    def mix() -> None:  # the kinds an engine step is made of: arithmetic, casts, views, slices
        for _ in range(SMALL_OPS):
            x.mul(x).add(x).to(torch.float32).view(-1)[:8]

    return _best_seconds(mix, repeats) / (5 * SMALL_OPS)


def measure_cpu(repeats: int = 5) -> dict[str, Any]:
    """Best of `repeats`: the rate the hardware can reach, as datasheets quote it."""
    import torch

    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), repeats)
    flops = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        n = MATMUL_N[name]
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        flops[name] = 2 * n**3 / _best_seconds(lambda a=a, b=b: torch.mm(a, b), repeats)
    return {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory_bandwidth_bytes_per_s": _stream_bytes_per_s(repeats),
        "copy_bandwidth_bytes_per_s": 2 * COPY_BYTES / copy_s,  # a copy reads and writes each byte
        "peak_flops": flops,
        "op_overhead_s": _op_overhead_s(repeats),
        "memory_bytes": physical_memory_bytes(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def load_or_measure(cache_path: Path, remeasure: bool = False) -> dict[str, Any]:
    """The cached figures if they were measured on this CPU, else a new measurement, cached."""
    if not remeasure and cache_path.is_file():
        try:
            cached = json.loads(cache_path.read_text())
        except (OSError, json.JSONDecodeError):
            cached = {}
        if cached.get("cpu") == cpu_name() and all(k in cached for k in MEASURED_KEYS):
            return cached
    figures = measure_cpu()
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(figures, indent=2) + "\n")
    except OSError as e:
        raise InferlabError(f"cannot write the cpu-local cache {cache_path}: {e}") from None
    return figures


def cpu_local_hardware(figures: dict[str, Any]) -> Hardware:
    """Measured rates are reachable ones: efficiencies are 1."""
    return Hardware(
        name=CPU_LOCAL,
        memory_bytes=int(figures["memory_bytes"]),
        memory_bandwidth_bytes_per_s=float(figures["memory_bandwidth_bytes_per_s"]),
        peak_flops={k: float(v) for k, v in figures["peak_flops"].items()},
        interconnect_bytes_per_s=float(figures["memory_bandwidth_bytes_per_s"]),
        source=(f"measured on {figures['cpu']} with {figures['threads']} threads, "
                f"torch {figures['torch']}, {figures['measured_at']}; bandwidth: one-row bf16 "
                f"matmuls (a plain copy: {figures.get('copy_bandwidth_bytes_per_s', 0) / 1e9:.1f} GB/s)"),
        runtime_overhead_bytes=CPU_RUNTIME_OVERHEAD_BYTES,
        bandwidth_efficiency=1.0,
        compute_efficiency=1.0,
        op_overhead_s=float(figures["op_overhead_s"]),
        measured=True,
    )

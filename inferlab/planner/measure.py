"""`--hardware cpu-local`: this machine's memory bandwidth and matmul rate, measured once with a
short PyTorch micro-benchmark and cached as JSON. The only planner module that touches torch,
and only inside `measure_cpu`.

Three things set a CPU decode step, so three are measured:
- the rate one-row bf16 matmuls stream weights from DRAM, through Llama-shaped layers of
  several widths: decode's memory roof (a plain copy is measured too, and shown, but the matmul
  kernel is what decode waits on, and on a CPU it is slower per byte on narrow layers);
- the square-matmul rate in bf16 and fp32: the compute roof (prefill);
- the host time of one eager transformer layer with tiny data: an eager engine launches dozens
  of operators per layer, each with a fixed cost (GPU servers hide it with CUDA graphs), and for
  a small model that is a good share of the step.
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
# working sets beyond the last-level cache (300 MiB L3 on this project's machines), so both
# stream from DRAM as a decode step of any but the smallest models does
COPY_BYTES = 512 * 2**20
STREAM_BYTES = 512 * 2**20  # weights per streaming pass (at least one layer's)
# CPU matmul kernels stream weights slower on narrow layers and change with the number of rows
# (one decode token per sequence), so the rate is measured on a grid of both
STREAM_WIDTHS = (512, 1024, 2048, 4096)
STREAM_ROWS = (1, 16)
MATMUL_N = {"bf16": 2048, "fp32": 1024}  # square sizes that take tens of ms each
MEASURED_KEYS = ("memory_bandwidth_bytes_per_s", "stream_bytes_per_s", "peak_flops",
                 "layer_overhead_s", "memory_bytes")
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


def layer_linear_shapes(width: int) -> list[tuple[int, int]]:
    """(in, out) of a Llama layer's linears at hidden size `width`, MLP 8/3 as wide: fused QKV,
    output, fused gate-up, down."""
    mlp = 8 * width // 3
    return [(width, 2 * width), (width, width), (width, 2 * mlp), (mlp, width)]


def _stream_bytes_per_s(width: int, repeats: int) -> dict[str, float]:
    """Weight bytes per second bf16 matmuls of 1 and 16 rows read through layers of this width."""
    import torch
    import torch.nn.functional as F

    shapes = layer_linear_shapes(width)
    layers = max(1, STREAM_BYTES // (2 * sum(i * o for i, o in shapes)))
    weights = [torch.full((o, i), 0.01, dtype=torch.bfloat16) for _ in range(layers) for i, o in shapes]
    total = sum(w.numel() * w.element_size() for w in weights)
    rates = {}
    for n in STREAM_ROWS:
        x = {i: torch.randn(n, i, dtype=torch.bfloat16) for i, _ in shapes}  # [rows, in]
        rates[str(n)] = total / _best_seconds(lambda x=x: [F.linear(x[w.shape[1]], w) for w in weights],
                                              repeats)
    return rates


def _stream_grid(repeats: int) -> dict[str, dict[str, float]]:
    """rows -> width -> bytes/s, with JSON's string keys."""
    by_width = {str(w): _stream_bytes_per_s(w, repeats) for w in STREAM_WIDTHS}
    return {str(n): {w: rates[str(n)] for w, rates in by_width.items()} for n in STREAM_ROWS}


def _tiny_layer_stack(num_layers: int, batch: int):  # -> a callable running the stack once
    """Eager Llama-style layers at width 64: RMSNorm, fused QKV, rotary, paged KV write and
    gather, SDPA, output projection, residual, RMSNorm, fused gate-up, SiLU, down, residual.
    Their data is tiny, so their time is the host's cost of launching those operators."""
    import torch
    import torch.nn.functional as F

    hidden, heads, kv_heads, head_dim, block = 64, 4, 2, 16, 16
    dt = torch.bfloat16

    def weights() -> dict[str, torch.Tensor]:
        return {"n1": torch.ones(hidden, dtype=dt), "n2": torch.ones(hidden, dtype=dt),
                "qkv": torch.randn((heads + 2 * kv_heads) * head_dim, hidden, dtype=dt),
                "o": torch.randn(hidden, heads * head_dim, dtype=dt),
                "gate_up": torch.randn(4 * hidden, hidden, dtype=dt),
                "down": torch.randn(hidden, 2 * hidden, dtype=dt),
                "k_cache": torch.zeros(batch + 1, block, kv_heads, head_dim, dtype=dt),
                "v_cache": torch.zeros(batch + 1, block, kv_heads, head_dim, dtype=dt)}

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def rotate(t: torch.Tensor) -> torch.Tensor:
        a, b = t.chunk(2, -1)
        return t * cos + torch.cat((-b, a), -1) * sin

    def layer(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        q, k, v = F.linear(norm(x, w["n1"]), w["qkv"]).split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        q, k = rotate(q.view(batch, heads, head_dim)), rotate(k.view(batch, kv_heads, head_dim))
        w["k_cache"].view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
        w["v_cache"].view(-1, kv_heads, head_dim).index_copy_(0, slots, v.view(batch, kv_heads, head_dim))
        keys = w["k_cache"][tables].flatten(1, 2)[:, :4]  # [batch, 4, kv_heads, head_dim]
        values = w["v_cache"][tables].flatten(1, 2)[:, :4]
        attn = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask[:, None, None, :], enable_gqa=True)  # [batch, heads, 1, head_dim]
        x = x + F.linear(attn.reshape(batch, heads * head_dim), w["o"])
        gate, up = F.linear(norm(x, w["n2"]), w["gate_up"]).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, w["down"])

    cos = torch.ones(batch, 1, head_dim, dtype=dt)  # [batch, 1, head_dim]
    sin = torch.zeros(batch, 1, head_dim, dtype=dt)
    slots = torch.arange(batch) * block + 3  # each sequence's 4th token
    tables = torch.arange(batch).unsqueeze(1)  # [batch, 1]: one block each
    mask = torch.ones(batch, 4, dtype=torch.bool)
    stack = [weights() for _ in range(num_layers)]
    x0 = torch.randn(batch, hidden, dtype=dt)

    def run() -> None:
        with torch.inference_mode():
            x = x0
            for w in stack:
                x = layer(x, w)

    return run


def _layer_overhead_s(repeats: int, num_layers: int = 8) -> float:
    """Host seconds per eager transformer layer at batch 1 (what CUDA graphs remove on GPUs)."""
    return _best_seconds(_tiny_layer_stack(num_layers, batch=1), 4 * repeats) / num_layers


def measure_cpu(repeats: int = 3) -> dict[str, Any]:
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
    figures = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "stream_bytes_per_s": _stream_grid(repeats),
        "copy_bandwidth_bytes_per_s": 2 * COPY_BYTES / copy_s,  # a copy reads and writes each byte
        "peak_flops": flops,
        "layer_overhead_s": _layer_overhead_s(repeats),
        "memory_bytes": physical_memory_bytes(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    # the headline figure: the best of the grid, closest to the memory system's own rate
    figures["memory_bandwidth_bytes_per_s"] = max(
        rate for by_width in figures["stream_bytes_per_s"].values() for rate in by_width.values())
    return figures


def load_or_measure(cache_path: Path, remeasure: bool = False, repeats: int = 3) -> dict[str, Any]:
    """The cached figures if they were measured on this CPU, else a new measurement, cached."""
    if not remeasure and cache_path.is_file():
        try:
            cached = json.loads(cache_path.read_text())
        except (OSError, json.JSONDecodeError):
            cached = {}
        if cached.get("cpu") == cpu_name() and all(k in cached for k in MEASURED_KEYS):
            return cached
    figures = measure_cpu(repeats)
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
        stream_rates={int(n): {int(w): float(b) for w, b in by_width.items()}
                      for n, by_width in figures["stream_bytes_per_s"].items()},
        peak_flops={k: float(v) for k, v in figures["peak_flops"].items()},
        interconnect_bytes_per_s=float(figures["memory_bandwidth_bytes_per_s"]),
        source=(f"measured on {figures['cpu']} with {figures['threads']} threads, "
                f"torch {figures['torch']}, {figures['measured_at']}; bandwidth: bf16 matmuls "
                f"streaming weights, by layer width and rows (a plain copy: "
                f"{figures.get('copy_bandwidth_bytes_per_s', 0) / 1e9:.1f} GB/s)"),
        runtime_overhead_bytes=CPU_RUNTIME_OVERHEAD_BYTES,
        bandwidth_efficiency=1.0,
        compute_efficiency=1.0,
        layer_overhead_s=float(figures["layer_overhead_s"]),
        measured=True,
    )

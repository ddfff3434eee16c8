"""`--hardware cpu-local`: this machine's memory bandwidth and matmul rate, measured with a short
PyTorch micro-benchmark (cpu_local.py caches the figures as JSON and plans with them). The only
planner module that touches torch, and only inside `measure_cpu`.

Three things set a CPU decode step, so three are measured:
- the rate the engine's linears stream weights from DRAM with 1 and 16 rows, in the dtype its
  --dtype auto runs here (bf16 through the packed C kernels where the CPU has AVX512-BF16 or
  AMX, else fp32 through the AVX2 kernels or oneDNN), through Llama-shaped layers of several
  widths: decode's memory roof (a plain copy is measured too, and shown, but the matmul kernel is
  what decode waits on, and on a CPU it is slower per byte on narrow layers); where the engine
  holds GGUF blocks as their codes, the same grid again with the layers held so (gguf_held.py);
- the square-matmul rate in bf16 and fp32: the compute roof (prefill);
- the host time of one of the engine's decoder layers with tiny data: each operator launch or
  Python call has a fixed cost (GPU servers hide it with CUDA graphs), and for a small model
  that is a good share of the step.
"""

from __future__ import annotations

import itertools
import os
import platform
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from inferlab.engine.cpuinfo import cpuinfo_field
from inferlab.planner.units import format_rate
from inferlab.timing import best_seconds

# working sets beyond the last-level cache (300 MiB L3 on this project's machines), so both
# stream from DRAM as a decode step of any but the smallest models does
COPY_BYTES = 512 * 2**20
STREAM_BYTES = 512 * 2**20  # weights per streaming pass (at least one layer's)
# CPU matmul kernels stream weights slower on narrow layers and change with the number of rows
# (one decode token per sequence), so the rate is measured on a grid of both
STREAM_WIDTHS = (512, 1024, 2048, 4096)
STREAM_ROWS = (1, 16)
# The widths double, so a wider layer's matrices hold 4x the weights: even where each call's
# fixed cost dominates, its rate is at most 4x the narrower one's; and every width streams from
# DRAM through the same kernels, so a narrower one is not 4x faster either. A rate more than
# this far below an adjacent width's (same rows) was timed while something else ran: best-of-3
# keeps such a point when the busy stretch outlasts all three (92 MB/s beside 3.9 GB/s).
NEIGHBOUR_TOLERANCE = 4.0
REMEASURE_TRIES = 3  # re-measurements of such a width before its rate is used as it is
MATMUL_N = {"bf16": 2048, "fp32": 1024}  # square sizes that take tens of ms each
# Smaller squares first, doubling until one product takes this long: without AVX512-BF16 torch's
# bf16 matmul runs ~0.3 GFLOP/s (AMD EPYC Zen 3: 58 s for the 2048^3 product)
MATMUL_MIN_S = 0.02
MATMUL_FIRST_N = 256
# 2: the stream grid's rates count the bytes its layers hold, held dense (version 1 narrowed them
# to codes on AVX2 CPUs and counted fp32 bytes: 2.7-3x the memory's rate); 3: and a grid of the
# layers held as codes where the engine holds GGUF blocks so; 4: the linears called as the C
# forward calls them (_as_the_engine_calls). An older cache is measured again.
MEASUREMENT_VERSION = 4


def cpu_name() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def layer_linear_shapes(width: int) -> list[tuple[int, int]]:
    """(in, out) of a Llama layer's linears at hidden size `width`, MLP about 8/3 as wide (a
    multiple of 64, as real models round it): fused QKV, output, fused gate-up, down."""
    mlp = 8 * width // 3 // 64 * 64
    return [(width, 2 * width), (width, width), (width, 2 * mlp), (mlp, width)]


def engine_dtype() -> Any:
    """The torch dtype the engine's --dtype auto runs on this CPU."""
    import torch

    from inferlab.engine.platform import resolve_dtype

    return resolve_dtype("auto", torch.device("cpu"))


def _stream_layers(width: int, narrow: bool = False) -> tuple[Any, int]:
    """Llama-shaped layers of this width, STREAM_BYTES of weights or one layer, as _constant_linears."""
    shapes = layer_linear_shapes(width)
    layers = max(1, STREAM_BYTES // (engine_dtype().itemsize * sum(i * o for i, o in shapes)))
    return _constant_linears(shapes * layers, narrow)


def _constant_linears(shapes: list[tuple[int, int]], narrow: bool) -> tuple[Any, int]:
    """Linears of these (in, out) shapes as the engine's, in the dtype it runs here, and the bytes
    their tensors hold. Their constant weights are exact Q4_1 blocks: held dense unless `narrow`,
    where the engine holds such blocks as codes (0.19x the fp32 bytes, which the rate once
    counted: an AVX2 machine's 21-27 GB/s measured as 57-77)."""
    import torch

    from inferlab.kernels.linear_choice import use_engine_linears

    dtype = engine_dtype()
    linears = torch.nn.ModuleList()
    for i, o in shapes:  # constant weights: random ones take seconds to draw
        linear = torch.nn.Linear(i, o, bias=False, device="meta")
        linear.weight = torch.nn.Parameter(torch.full((o, i), 0.01, dtype=dtype))
        linears.append(linear)
    use_engine_linears(linears, torch.device("cpu"), dtype, narrow=narrow)
    return linears, sum(t.nbytes for t in itertools.chain(linears.parameters(), linears.buffers()))


def _stream_bytes_per_s(width: int, repeats: int, narrow: bool = False) -> dict[str, float]:
    """Weight bytes per second the engine's matmuls of 1 and 16 rows read through layers of
    this width (held as codes if `narrow` and the engine holds them so)."""
    import torch

    linears, held = _stream_layers(width, narrow)
    dtype = engine_dtype()
    rates = {}
    with torch.inference_mode():
        for n in STREAM_ROWS:
            x = {m.in_features: torch.randn(n, m.in_features, dtype=dtype) for m in linears}  # [rows, in]
            calls = [_as_the_engine_calls(m, x[m.in_features]) for m in linears]
            rates[str(n)] = held / best_seconds(lambda calls=calls: [call() for call in calls], repeats)
    return rates


def _as_the_engine_calls(linear: Any, x: Any) -> Callable[[], Any]:
    """The linear on x as the engine's decode step runs it: its C kernel with no Python between,
    where the C model forward runs here and the kernel takes x's rows, else the module. Through the
    modules a bf16 decode step of the embedded model was planned at 1.54x the engine's on an
    Intel Xeon with AMX: 15 us of Python a call slowed the 576-wide layers' stream by a fifth."""
    from inferlab.kernels import cpu_ops

    if (hasattr(linear, "c_desc") and cpu_ops.model_forward_available(x.dtype)
            and x.shape[0] <= getattr(linear, "kernel_max_rows", x.shape[0])):
        return cpu_ops.bound_kernel_call(linear.c_desc(), x)[0]
    return lambda: linear(x)


def engine_holds_codes() -> bool:
    """Whether the engine's linears here hold exact GGUF blocks as codes: one small layer narrows."""
    _, held = _constant_linears([(256, 64)], narrow=True)
    return held < 256 * 64 * engine_dtype().itemsize


def _stream_grid(repeats: int, narrow: bool = False) -> dict[str, dict[str, float]]:
    """rows -> width -> bytes/s, with JSON's string keys."""
    by_width = {str(w): _stream_bytes_per_s(w, repeats, narrow) for w in STREAM_WIDTHS}
    return {str(n): {w: rates[str(n)] for w, rates in by_width.items()} for n in STREAM_ROWS}


def _checked_stream_grid(repeats: int, narrow: bool = False) -> dict[str, dict[str, float]]:
    """The grid a plan interpolates in: a rate far below its neighbours' is measured again a
    few times, keeping the best, and warned of if it stays so."""
    grid = _stream_grid(repeats, narrow)
    slow = slow_stream_points(grid)
    for _ in range(REMEASURE_TRIES):
        if not slow:
            break
        for width in sorted({width for _, width, _ in slow}, key=int):
            for rows, rate in _stream_bytes_per_s(int(width), repeats, narrow).items():
                grid[rows][width] = max(grid[rows][width], rate)  # best of all tries
        slow = slow_stream_points(grid)
    if slow:
        print(f"warning: the machine was busy while measuring: {describe_slow_point(grid, slow[0])} "
              f"after {REMEASURE_TRIES} re-measurements; the figures and plans from them may be "
              f"off (measure again when the machine is idle)", file=sys.stderr)
    return grid


def slow_stream_points(grid: dict[str, dict[str, float]]) -> list[tuple[str, str, str]]:
    """(rows, width, neighbour width) of each rate more than NEIGHBOUR_TOLERANCE times below an
    adjacent width's at the same rows: a point measured while the machine was busy."""
    slow = []
    for rows, by_width in grid.items():
        for pair in itertools.pairwise(sorted(by_width, key=int)):
            low, high = sorted(pair, key=by_width.__getitem__)
            if by_width[high] > NEIGHBOUR_TOLERANCE * by_width[low]:
                slow.append((rows, low, high))
    return slow


def describe_slow_point(grid: dict[str, dict[str, float]], point: tuple[str, str, str]) -> str:
    rows, width, neighbour = point
    return (f"weight streaming at width {width}, {rows} row{'' if rows == '1' else 's'} ran at "
            f"{format_rate(grid[rows][width], 'B/s')} against "
            f"{format_rate(grid[rows][neighbour], 'B/s')} at width {neighbour}, over "
            f"{NEIGHBOUR_TOLERANCE:g}x apart")


def stream_bandwidth_bytes_per_s(repeats: int = 3) -> float:
    """The headline memory roof alone (a few seconds): the best rate of the stream grid, closest
    to the memory system's own rate. Benchmarks re-measure it beside each timed run on machines
    whose bandwidth moves from minute to minute. A slow point leaves the best rate as it is, so
    none is measured again here."""
    return _best_rate(_stream_grid(repeats))


def _best_rate(grid: dict[str, dict[str, float]]) -> float:
    return max(rate for by_width in grid.values() for rate in by_width.values())


def _tiny_model_forward(num_layers: int) -> Callable[[], None]:  # runs one decode forward
    """The engine's own Llama layers at width 128 (its dtype and linears),
    one decode token over a 4-token paged context. Their data is tiny, so their time is the
    host's cost of running a layer: Python and operator launches, or the C model forward's
    per-layer share of its one call where the engine has it."""
    import torch

    from inferlab.kernels.attention.metadata import AttentionMetadata
    from inferlab.kernels.linear_choice import use_engine_linears
    from inferlab.models.config import ModelConfig
    from inferlab.models.llama import LlamaForCausalLM

    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=128,
                      intermediate_size=256, num_layers=num_layers, num_heads=2, num_kv_heads=1,
                      head_dim=64, max_position_embeddings=64)
    dtype = engine_dtype()
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    use_engine_linears(model, torch.device("cpu"), dtype)
    block = 16
    caches = [(torch.zeros(2, block, 1, 64, dtype=dtype), torch.zeros(2, block, 1, 64, dtype=dtype))
              for _ in range(num_layers)]
    ids, positions = torch.tensor([5]), torch.tensor([3])

    def run() -> None:
        meta = AttentionMetadata.build([1], [4], [[1]], block)  # built per step, as the engine does
        with torch.inference_mode():
            model(ids, positions, caches, meta)

    return run


def _layer_overhead_s(repeats: int) -> float:
    """Host seconds per decoder layer at batch 1 (what CUDA graphs remove on GPUs): the
    difference between 32 and 8 tiny layers, so the per-forward costs cancel. The two are timed
    in alternation and the median difference kept: on a shared machine a slow stretch that hit
    only one of them once gave a difference of zero."""
    deep, shallow = _tiny_model_forward(32), _tiny_model_forward(8)
    differences = [best_seconds(deep, 4) - best_seconds(shallow, 4) for _ in range(2 * repeats + 1)]
    return max(statistics.median(differences), 0.0) / 24


def _matmuls(dtype: Any) -> list[Callable[[Any, Any], Any]]:
    """The square products to time for a dtype: torch.mm, and for fp32 also the oneDNN matmul
    the engine's fp32 linears run (faster than torch.mm's MKL on AMD CPUs)."""
    import torch

    from inferlab.kernels.onednn_linear import onednn_linear, onednn_linear_supported

    fp32_onednn = onednn_linear_supported(torch.device("cpu"), dtype)
    return [torch.mm, onednn_linear] if fp32_onednn else [torch.mm]


def _matmul_flops(dtype: Any, largest_n: int, repeats: int) -> float:
    """FLOP/s of the fastest square product in `dtype`, sides doubling from MATMUL_FIRST_N until
    one product takes MATMUL_MIN_S or the side reaches largest_n."""
    import torch

    n = MATMUL_FIRST_N
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        seconds = min(best_seconds(lambda a=a, b=b, mm=mm: mm(a, b), repeats) for mm in _matmuls(dtype))
        if seconds >= MATMUL_MIN_S or n >= largest_n:
            return 2 * n**3 / seconds
        n *= 2


def measure_cpu(repeats: int = 3) -> dict[str, Any]:
    """Best of `repeats`: the rate the hardware can reach, as datasheets quote it."""
    import torch

    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = best_seconds(lambda: dst.copy_(src), repeats)
    flops = {name: _matmul_flops(dtype, MATMUL_N[name], repeats)
             for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    figures = {
        "cpu": cpu_name(),
        "measurement_version": MEASUREMENT_VERSION,
        "threads": torch.get_num_threads(),
        "linear_dtype": str(engine_dtype()).removeprefix("torch."),  # the stream grid's
        "torch": torch.__version__,
        "stream_bytes_per_s": _checked_stream_grid(repeats),
        "copy_bandwidth_bytes_per_s": 2 * COPY_BYTES / copy_s,  # a copy reads and writes each byte
        "peak_flops": flops,
        "layer_overhead_s": _layer_overhead_s(repeats),
        "memory_bytes": physical_memory_bytes(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    figures["memory_bandwidth_bytes_per_s"] = _best_rate(figures["stream_bytes_per_s"])
    if engine_holds_codes():  # GGUF files are planned with it (gguf_held.py)
        figures["codes_stream_bytes_per_s"] = _checked_stream_grid(repeats, narrow=True)
    return figures

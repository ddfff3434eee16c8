"""The decode linears against the memory floor: each variant's decoder linears (bf16, W8A16,
W4A16, ...) at one row, called back to back from C as the decode layer calls them, beside a
plain two-thread read of the same weight buffers in the same order and split.

Why: a single-row decode step is bound by reading the weights, so the speed of a quantized
linear is its bytes over the rate it streams them. This says how much of that rate a kernel
leaves on the table (its time over the plain read's) apart from the machine's bandwidth, which
on this VM moves from minute to minute. The caches are flushed before every pass, as in a decode
step, where the lm_head and the other layers have evicted a layer's weights by its next turn;
without the flush a 56 MB int4 model finds part of itself still cached (this VM holds tens of MB
beyond its L3). The plain read covers the weight codes only: group scales (6% more bytes for
int4 in groups of 64) and the activations' quantization are part of what the kernel costs.
Variants and the reads take turns, so a slow second falls on all of them; medians are printed.

The plain read is the roofline here: what this machine's memory gives this access pattern in
the same minute. Compiles a small C file with the system's `cc` that calls the engine's own
`linear_forward` through a function pointer, so the kernels measured are the library the engine
loads.

With `--rows N` the linears take N rows a call, as a decode batch of N sequences does: the
kernels then do N rows of arithmetic on each weight byte, and the read is the bound no more.

    .venv/bin/python benchmarks/linear_floor.py [MODEL] [--schemes W8A16,W4A16] [--turns 20] [--rows 1]
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from quant_speed import RTN_SCHEMES, largest_group, measured, quantized_modules
from workloads import exit_on_sigterm, model_path, positive_int, scheme_list, script_parser

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.cpu_linear import packed_linear_supported, use_packed_linears
from inferlab.models.loader import load_model

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <time.h>
#include "kernels.h"

typedef int (*forward_fn)(const linear_t *, const uint16_t *, int64_t, int64_t, uint16_t *);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Every 64-byte line of [buf, buf + n) loaded and fed to one vpdpbusd (a loop the compiler cannot
 * drop), with the kernels' software prefetch: 2 KB ahead into L1. */
static int32_t read_span(const uint8_t *buf, int64_t n) {
    __m512i acc = _mm512_setzero_si512(), ones = _mm512_set1_epi32(0x01010101);
    for (int64_t i = 0; i + 64 <= n; i += 64) {
        _mm_prefetch((const char *)buf + i + 2048, _MM_HINT_T0);
        acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(buf + i), ones);
    }
    return _mm512_reduce_add_epi32(acc);
}

/* Both threads read their half of [buf, buf + n). */
static int32_t read_shared(const uint8_t *buf, int64_t n) {
    int32_t sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
        const int64_t half = n / omp_get_num_threads() / 64 * 64;
        sum += read_span(buf + omp_get_thread_num() * half, half);
    }
    return sum;
}

static int64_t code_bytes(const linear_t *l) {
    const int64_t values = l->n_out * l->k_in;
    return l->kind == LINEAR_BF16 ? 2 * values : l->kind == LINEAR_INT4 ? values / 2 : values;
}

int32_t flush_caches(const uint8_t *junk, int64_t n) { return read_shared(junk, n); }

/* Bytes of the n linears' weight codes: what time_reads reads. */
int64_t total_code_bytes(const linear_t *ls, int64_t n) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += code_bytes(&ls[i]);
    return total;
}

/* Seconds for one pass of the n linears at `rows` rows (x [rows][k_max], y: scratch wide
 * enough), or -1 when a kernel could not allocate its scratch memory. */
double time_linears(forward_fn forward, const linear_t *ls, int64_t n, const uint16_t *x, int64_t x_stride,
                    int64_t rows, uint16_t *y) {
    double start = now();
    for (int64_t i = 0; i < n; i++)
        if (forward(&ls[i], x, x_stride, rows, y)) return -1.0;
    return now() - start;
}

/* Seconds for a plain read of the n linears' weight codes, in their order, split as the kernels
 * split them between the threads. */
double time_reads(const linear_t *ls, int64_t n, int32_t *sink) {
    double start = now();
    for (int64_t i = 0; i < n; i++) *sink += read_shared(ls[i].weight, code_bytes(&ls[i]));
    return now() - start;
}
"""

C_KERNEL_SCHEMES = tuple(name for name in RTN_SCHEMES if name != "FP8_BLOCK")  # no linear_forward kernel
FLUSH_BYTES = 192 << 20  # six times this VM's 32 MiB L3, past the tens of MB it holds beyond it


def build_harness(workdir: Path) -> ctypes.CDLL:
    source, library = workdir / "floor.c", workdir / "floor.so"
    source.write_text(SOURCE)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
                    f"-I{cpu_library.SOURCES[0].parent}", "-o", str(library), str(source)], check=True)
    lib = ctypes.CDLL(str(library))
    lib.time_linears.restype = lib.time_reads.restype = ctypes.c_double
    lib.time_linears.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p]
    lib.time_reads.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.flush_caches.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.total_code_bytes.restype = ctypes.c_int64
    lib.total_code_bytes.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    return lib


def variant_linears(model: str | None, schemes: list[str], group_size: int) -> tuple[dict, int]:
    """Each variant's decoder linears, bf16 first, all with a C kernel; and the group size."""
    net = load_model(model, torch.bfloat16).model
    group = largest_group(net, group_size)
    quantized = {name: quantized_modules(net, name, group, False) for name in schemes}
    use_packed_linears(net)
    variants = {"bf16": {n: m for n, m in net.named_modules() if measured(n, False)}, **quantized}
    if not all(hasattr(m, "c_desc") for ms in variants.values() for m in ms.values()):
        raise SystemExit("a variant's linears have no C kernel here")
    return variants, group


def interleaved_seconds(harness: ctypes.CDLL, descs: dict, turns: int,
                        rows: int) -> dict[tuple[str, str], list[float]]:
    """(variant, "kernel" or "read") -> seconds of each turn's pass, every pass after a flush."""
    forward = ctypes.cast(cpu_library.library().linear_forward, ctypes.c_void_p)
    x = torch.randn(rows, max(d.k_in for ds in descs.values() for d in ds)).to(torch.bfloat16)
    y = torch.empty(rows, max(d.n_out for ds in descs.values() for d in ds), dtype=torch.bfloat16)
    junk, sink = torch.ones(FLUSH_BYTES, dtype=torch.uint8), ctypes.c_int32(0)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(turns):
        for name, ds in descs.items():
            harness.flush_caches(junk.data_ptr(), FLUSH_BYTES)
            seconds = harness.time_linears(forward, ds, len(ds), x.data_ptr(), x.stride(0), rows, y.data_ptr())
            if seconds < 0:
                raise MemoryError("linear_forward could not allocate its scratch memory")
            times.setdefault((name, "kernel"), []).append(seconds)
            harness.flush_caches(junk.data_ptr(), FLUSH_BYTES)
            times.setdefault((name, "read"), []).append(harness.time_reads(ds, len(ds), ctypes.byref(sink)))
    return times


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("model", nargs="?", default=None, type=model_path)
    parser.add_argument("--schemes", type=scheme_list(C_KERNEL_SCHEMES), default="W8A16,W4A16")
    parser.add_argument("--group-size", type=positive_int, default=128)
    parser.add_argument("--turns", type=positive_int, default=20)
    parser.add_argument("--rows", type=positive_int, default=1, help="rows a call (a decode batch)")
    args = parser.parse_args()
    exit_on_sigterm()  # the harness's temporary folder removed
    if not (cpu_ops.quant_linear_available() and packed_linear_supported(torch.device("cpu"), torch.bfloat16)):
        raise SystemExit("the C linear kernels are not available on this machine")
    variants, group = variant_linears(args.model, args.schemes, args.group_size)
    # pointers into the variants' tensors, which stay alive as long as `variants`
    descs = {name: (cpu_library.LinearDesc * len(ms))(*[m.c_desc() for m in ms.values()])
             for name, ms in variants.items()}
    with tempfile.TemporaryDirectory() as tmp:
        harness = build_harness(Path(tmp))
        times = interleaved_seconds(harness, descs, args.turns, args.rows)
    codes = {name: harness.total_code_bytes(ds, len(ds)) for name, ds in descs.items()}
    print(f"{len(descs['bf16'])} decoder linears at {args.rows} row(s), caches flushed before each pass, "
          f"medians of {args.turns} turns (group size {group})")
    print(f"{'variant':10} {'kernel ms':>10} {'GB/s':>6} {'read ms':>8} {'GB/s':>6} {'kernel / read':>14}")
    for name in descs:
        kernel, read = statistics.median(times[(name, "kernel")]), statistics.median(times[(name, "read")])
        print(f"{name:10} {kernel * 1e3:10.3f} {codes[name] / kernel / 1e9:6.1f} {read * 1e3:8.3f} "
              f"{codes[name] / read / 1e9:6.1f} {kernel / read:13.2f}x")


if __name__ == "__main__":
    main()

"""How fast this CPU retires 512-bit instructions: latency of one vdpbf16ps chain, throughput of
twelve independent chains of vdpbf16ps, vpdpbusd, 512-bit FMAs and 256-bit FMAs, per core; and,
on a CPU with AMX, the cost of a tile product (four independent, or a dependent chain), of a tile
load feeding one, and of a tile store.

Each chain starts from its own value: chains that start equal compute the same thing, and gcc
merged eight such chains into one (this script printed 0.67 ns per vdpbf16ps on an AMD EPYC
whose real rate is 0.13 ns).

A kernel that decodes weights (int8, int4) spends several vector instructions per 64 bytes it
reads; whether it is bound by memory or by those instructions depends on these rates, which on a
shared VM can be far below the datasheet's two per cycle. Compiles a small C program with the
system's `cc` (-march=native) and runs it on one core.

    .venv/bin/python benchmarks/simd_rate.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from workloads import exit_on_sigterm, script_parser

from inferlab.engine.platform import cpu_flags

NEEDED_FLAGS = {"avx512_bf16", "avx512_vnni"}  # the instructions SOURCE times

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define KEEP12(x) __asm__ volatile("" :: "v"(x[0]), "v"(x[1]), "v"(x[2]), "v"(x[3]), "v"(x[4]), "v"(x[5]), \
                                      "v"(x[6]), "v"(x[7]), "v"(x[8]), "v"(x[9]), "v"(x[10]), "v"(x[11]))
#define RATE(name, x, step) do { \
        double t0 = now(); \
        for (long i = 0; i < n; i++) { for (int j = 0; j < 12; j++) x[j] = step; KEEP12(x); } \
        printf("%s, 12 independent chains: %.3f ns per instruction\n", name, (now() - t0) / n / 12 * 1e9); \
    } while (0)
int main(void) {
    const long n = 50000000;
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    __m512i bytes = _mm512_set1_epi8(1);
    __m512 c[12], f[12], one = _mm512_set1_ps(1.0f);
    __v16si d[12];  /* not __m512i: gcc 12 copies those between registers at every step */
    __m256 g[12], one8 = _mm256_set1_ps(1.0f);
    for (int j = 0; j < 12; j++) {  /* distinct starts: equal chains would be merged into one */
        c[j] = f[j] = _mm512_set1_ps((float)j);
        d[j] = (__v16si)_mm512_set1_epi32(j);
        g[j] = _mm256_set1_ps((float)j);
    }
    double t = now();
    for (long i = 0; i < n; i++) { c[0] = _mm512_dpbf16_ps(c[0], a, a); __asm__ volatile("" :: "v"(c[0])); }
    printf("vdpbf16ps, one dependent chain: %.3f ns per instruction\n", (now() - t) / n * 1e9);
    RATE("vdpbf16ps", c, _mm512_dpbf16_ps(c[j], a, a));
    RATE("vpdpbusd", d, (__v16si)_mm512_dpbusd_epi32((__m512i)d[j], bytes, bytes));
    RATE("512-bit FMA", f, _mm512_fmadd_ps(f[j], one, one));
    RATE("256-bit FMA", g, _mm256_fmadd_ps(g[j], one8, one8));
#ifdef __AMX_BF16__
    struct { uint8_t palette, start, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    static char buf[8192] __attribute__((aligned(64)));
    float out[256];
    const long m = n / 10;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int j = 0; j < 8; j++) { cfg.rows[j] = 16; cfg.colsb[j] = 64; }
    _tile_loadconfig(&cfg);
    _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    t = now();
    for (long i = 0; i < m; i++) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
    printf("tdpbf16ps (16x16x32), 4 independent: %.2f ns per instruction\n", (now() - t) / m / 4 * 1e9);
    t = now();
    for (long i = 0; i < m; i++) _tile_dpbf16ps(0, 4, 6);
    printf("tdpbf16ps, one dependent chain: %.2f ns per instruction\n", (now() - t) / m * 1e9);
    t = now();
    for (long i = 0; i < m; i++) {
        _tile_loadd(4, buf + (i & 3) * 1024, 64); _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, buf + 4096 + (i & 3) * 1024, 64); _tile_dpbf16ps(1, 5, 6);
    }
    printf("tile load (L1) + tdpbf16ps: %.2f ns per pair\n", (now() - t) / m / 2 * 1e9);
    t = now();
    for (long i = 0; i < m; i++) { _tile_stored(0, out, 64); __asm__ volatile("" :: "r"(out) : "memory"); }
    printf("tile store: %.2f ns\n", (now() - t) / m * 1e9);
    _tile_release();
#endif
    return 0;
}
"""


def main() -> None:
    script_parser(__doc__).parse_args()
    missing = NEEDED_FLAGS - cpu_flags()
    if missing:
        raise SystemExit(f"simd_rate: this CPU lacks {', '.join(sorted(missing))} (the 512-bit "
                         "instructions this script times); nothing to measure here")
    exit_on_sigterm()  # the compiled program's temporary folder removed
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "rate.c", Path(tmp) / "rate"
        src.write_text(SOURCE)
        subprocess.run(["cc", "-O3", "-march=native", "-o", str(exe), str(src)], check=True)
        print(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout, end="")


if __name__ == "__main__":
    main()

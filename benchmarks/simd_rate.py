"""How fast this CPU retires 512-bit instructions: latency of one vdpbf16ps chain, throughput of
eight independent chains of vdpbf16ps, of 512-bit FMAs and of 256-bit FMAs, per core.

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

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define KEEP8(x) __asm__ volatile("" :: "v"(x[0]), "v"(x[1]), "v"(x[2]), "v"(x[3]), "v"(x[4]), "v"(x[5]), "v"(x[6]), "v"(x[7]))
int main(void) {
    const long n = 50000000;
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    __m512 c[8], f[8], one = _mm512_set1_ps(1.0f);
    __m256 g[8], one8 = _mm256_set1_ps(1.0f);
    for (int j = 0; j < 8; j++) { c[j] = _mm512_setzero_ps(); f[j] = c[j]; g[j] = _mm256_setzero_ps(); }
    double t = now();
    for (long i = 0; i < n; i++) { c[0] = _mm512_dpbf16_ps(c[0], a, a); __asm__ volatile("" :: "v"(c[0])); }
    printf("vdpbf16ps, one dependent chain: %.2f ns per instruction\n", (now() - t) / n * 1e9);
    t = now();
    for (long i = 0; i < n; i++) { for (int j = 0; j < 8; j++) c[j] = _mm512_dpbf16_ps(c[j], a, a); KEEP8(c); }
    printf("vdpbf16ps, 8 independent chains: %.2f ns per instruction\n", (now() - t) / n / 8 * 1e9);
    t = now();
    for (long i = 0; i < n; i++) { for (int j = 0; j < 8; j++) f[j] = _mm512_fmadd_ps(f[j], one, one); KEEP8(f); }
    printf("512-bit FMA, 8 independent chains: %.2f ns per instruction\n", (now() - t) / n / 8 * 1e9);
    t = now();
    for (long i = 0; i < n; i++) { for (int j = 0; j < 8; j++) g[j] = _mm256_fmadd_ps(g[j], one8, one8); KEEP8(g); }
    printf("256-bit FMA, 8 independent chains: %.2f ns per instruction\n", (now() - t) / n / 8 * 1e9);
    return 0;
}
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "rate.c", Path(tmp) / "rate"
        src.write_text(SOURCE)
        subprocess.run(["cc", "-O2", "-march=native", "-o", str(exe), str(src)], check=True)
        print(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout, end="")


if __name__ == "__main__":
    main()

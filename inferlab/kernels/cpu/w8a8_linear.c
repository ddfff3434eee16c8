/* W8A8 linears: int8 weights per output channel, each row of x quantized to int8 per call
 * (dynamic per-token scales), sums in int32.
 *
 * Why: a prefill is bound by the arithmetic, and AMX multiplies int8 at twice bf16's rate; a
 * decode step is bound by reading the weights, and vpdpbusd takes 64 of them per instruction
 * from one 64-byte load, with nothing to convert. Both read one layout:
 *
 *   weights [N/16][K/4][16][4]: for each block of 16 outputs and each quad of inputs, the 16
 *   outputs' four codes side by side (64 bytes): a row of an AMX B tile, and vpdpbusd's signed
 *   operand against a broadcast quad of x.
 *   scale fp32 [N]; weight_sums int32 [N]: vpdpbusd multiplies unsigned x, so x + 128 goes in
 *   and 128 * sum(w) comes off, exactly.
 *
 * x quantizes as torch does it in inferlab/quant/linear.py: scale_r = max(absmax_r, 1e-12) / 127,
 * q = round-half-even(x * (1 / scale_r)), as vLLM's CPU kernel (a multiply, not a division). y = sum(q w) * scale_r * scale_w (+ bias), one rounding to
 * bf16. A row's result does not depend on the other rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define TILE_ROWS 4

/* rows of bf16 x -> int8 codes [rows][K] and their scales. */
static void quantize_rows(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k_in,
                          int8_t *xq, float *scales) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * x_stride;
        __m512 top = _mm512_setzero_ps();
        for (int64_t k = 0; k < k_in; k += 16)  /* K % 64 == 0: whole vectors */
            top = _mm512_max_ps(top, _mm512_abs_ps(bf16x16_to_f32(row + k)));
        const float scale = fmaxf(_mm512_reduce_max_ps(top), 1e-12f) / 127.0f;
        const __m512 inv = _mm512_set1_ps(1.0f / scale);
        for (int64_t k = 0; k < k_in; k += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(bf16x16_to_f32(row + k), inv));  /* ties to even */
            _mm_storeu_si128((__m128i *)(xq + r * k_in + k), _mm512_cvtsepi32_epi8(q));
        }
        scales[r] = scale;
    }
}

/* Two 16-output blocks (b0, b0 + 1; an odd last block is read twice and written once) for
 * ROWS <= TILE_ROWS quantized rows; ROWS is a constant so the sums stay in registers. */
static inline __attribute__((always_inline)) void vnni_blocks(
        const linear_t *l, const int8_t *xq, const float *x_scale, const int ROWS, uint16_t *y,
        int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, blocks = n / 16, quads = k / 4;
    const int nb = blocks - b0 < 2 ? 1 : 2;
    const int8_t *w[2] = {(const int8_t *)l->weight + b0 * k * 16,
                          (const int8_t *)l->weight + (b0 + nb - 1) * k * 16};
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);  /* q + 128 as unsigned bytes */
    __m512i acc[2][2][TILE_ROWS];
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < 2; b++)
            for (int m = 0; m < ROWS; m++) acc[p][b][m] = _mm512_setzero_si512();
    for (int64_t qd = 0; qd < quads; qd += 2) {
        for (int b = 0; b < 2; b++) _mm_prefetch((const char *)(w[b] + (qd + 32) * 64), _MM_HINT_T0);
        for (int p = 0; p < 2; p++) {
            __m512i xv[TILE_ROWS];
            for (int m = 0; m < ROWS; m++) {
                int32_t four;
                memcpy(&four, xq + m * k + 4 * (qd + p), 4);
                xv[m] = _mm512_xor_si512(_mm512_set1_epi32(four), flip);
            }
            for (int b = 0; b < 2; b++) {
                __m512i wv = _mm512_loadu_si512(w[b] + (qd + p) * 64);
                for (int m = 0; m < ROWS; m++) acc[p][b][m] = _mm512_dpbusd_epi32(acc[p][b][m], xv[m], wv);
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(l->weight_sums + col), 7);
        __m512 w_scale = _mm512_loadu_ps(l->scale + col), bias = bias_f32(l->bias ? l->bias + col : NULL);
        for (int m = 0; m < ROWS; m++) {
            __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(acc[0][b][m], acc[1][b][m]), offset);
            __m512 out = _mm512_mul_ps(_mm512_cvtepi32_ps(sum),
                                       _mm512_mul_ps(w_scale, _mm512_set1_ps(x_scale[m])));
            store_bf16(y + m * n + col, _mm512_add_ps(out, bias));
        }
    }
}

/* Row tiles of up to TILE_ROWS, each reading the weights once; the switch inside the parallel
 * loop gives every case a constant ROWS (see quant_linear.c). */
static void vnni_rows(const linear_t *l, const int8_t *xq, const float *x_scale, int64_t rows,
                      uint16_t *y) {
    for (int64_t r = 0; r < rows; r += TILE_ROWS) {
        const int tile = (int)(rows - r < TILE_ROWS ? rows - r : TILE_ROWS);
        const int8_t *xr = xq + r * l->k_in;
        const float *sr = x_scale + r;
        uint16_t *yr = y + r * l->n_out;
#pragma omp parallel for schedule(static)
        for (int64_t b0 = 0; b0 < l->n_out / 16; b0 += 2) {
            switch (tile) {
            case 1: vnni_blocks(l, xr, sr, 1, yr, b0); break;
            case 2: vnni_blocks(l, xr, sr, 2, yr, b0); break;
            case 3: vnni_blocks(l, xr, sr, 3, yr, b0); break;
            default: vnni_blocks(l, xr, sr, 4, yr, b0); break;
            }
        }
    }
}

/* y [rows, N] = quantized(x) [rows, K] @ W^T, scaled (+ bias). K % 64 == 0, N % 16 == 0
 * (checked by the caller). Returns 0, or -2 when out of memory. */
int w8a8_linear(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *y) {
    int8_t *xq = malloc((size_t)(rows * l->k_in));
    float *scales = malloc(sizeof(float) * (size_t)rows);
    int status = xq && scales ? 0 : -2;
    if (!status) {
        quantize_rows(x, x_stride, rows, l->k_in, xq, scales);
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
        if (rows > TILE_ROWS && has_amx())
            status = amx_gemm(xq, l->k_in, rows, l->weight, l->k_in, 1, scales, l->scale, l->bias,
                              y, l->n_out);
        else
#endif
            vnni_rows(l, xq, scales, rows, y);
    }
    free(xq);
    free(scales);
    return status;
}

int has_w8a8_linear(void) { return 1; }
#else
int has_w8a8_linear(void) { return 0; }
#endif

/* Linears whose activations are quantized per call, each row with its own scale (dynamic
 * per-token quantization) or all with one calibrated scale (static, linear_t.input_scale), for
 * bf16 models: W8A8 (int8) and FP8_DYNAMIC / FP8 (fp8 e4m3).
 *
 * W8A8. Why: a prefill is bound by the arithmetic, and AMX multiplies int8 at twice bf16's
 * rate; a decode step is bound by reading the weights, and vpdpbusd takes 64 of them per
 * instruction from one 64-byte load, with nothing to convert. Both read one layout:
 *
 *   weights [N/16][K/4][16][4]: for each block of 16 outputs and each quad of inputs, the 16
 *   outputs' four codes side by side (64 bytes): a row of an AMX B tile, and vpdpbusd's signed
 *   operand against a broadcast quad of x.
 *   scale fp32 [N]; weight_sums int32 [N]: vpdpbusd multiplies unsigned x, so x + 128 goes in
 *   and 128 * sum(w) comes off, exactly.
 *
 * x quantizes as torch does it in inferlab/quant/linear.py: scale_r = max(absmax_r, 1e-12) / 127,
 * q = round-half-even(x * (1 / scale_r)), as vLLM's CPU kernel (a multiply, not a division).
 * y = sum(q w) * scale_r * scale_w (+ bias), exact int32 sums, one rounding to bf16.
 *
 * FP8_DYNAMIC. Why: this CPU has no fp8 arithmetic, and torch's path (widen the whole fp8
 * weight to bf16 in every call, then a GEMM) ran at 0.03x bf16. But every e4m3 value is exact
 * in bf16, so the products of rounded activations and weights are exact in vdpbf16ps and AMX
 * bf16 tiles, summed in fp32. The weight keeps its 1-byte codes:
 *
 *   codes [N/16][K/2][16][2]: matmul.c's bf16 layout with one byte per weight, so 32 codes
 *   widen to one vector of VNNI pairs: bits = (magnitude << 4) + (120 << 7) re-biases a normal
 *   e4m3 number into bf16, a table of eight gives the subnormals (m * 2^-9), the sign moves to
 *   bit 15. scale fp32 [N].
 *
 * x rounds as the torch reference (Fp8DynamicLinear) rounds it: scale_r = max(absmax_r, 1e-12)
 * / 448, v = x / scale_r (a division), clamped to +-448, rounded to the nearest e4m3 value, ties
 * to even. y = sum(v w) * scale_r * scale_w (+ bias), one rounding to bf16.
 *
 * Both: up to TILE_ROWS rows go through the kernels here, reading the weight once; more go to
 * matmul.c's AMX GEMM or, without AMX, vnni_gemm.c's register tiles (int8 on the codes; bf16 on
 * the fp8 codes widened once per call), which scale the same way. A row's result does
 * not depend on the other rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define TILE_ROWS 4
#define TASK_BLOCKS 2 /* 16-output blocks a task, see kernel_rows */
#define FP8_MAX 448.0f

/* A bf16 row's largest |x|, from the bits: a non-negative float's bits order as integers do,
 * so 32 magnitudes a step go through an integer max without widening (NaN, whose bits are the
 * largest, comes out, as torch's amax gives it). */
static inline float row_absmax(const uint16_t *row, int64_t k_in) {  /* K % 32 == 0 */
    const __m512i magnitude = _mm512_set1_epi16(0x7fff);
    __m512i top = _mm512_setzero_si512();
    for (int64_t k = 0; k < k_in; k += 32)
        top = _mm512_max_epu16(top, _mm512_and_si512(_mm512_loadu_si512(row + k), magnitude));
    top = _mm512_max_epu32(_mm512_and_si512(top, _mm512_set1_epi32(0xffff)), _mm512_srli_epi32(top, 16));
    return bf16_to_f32((uint16_t)_mm512_reduce_max_epu32(top));
}

/* Row r + ROWS_AHEAD of x asked for while row r is quantized (prefetch_lines). x was just
 * written, in part by the other core, and each row's first read (the absmax) waited on it: a
 * W8A8 512-token prefill's 120 quantizations took 4.2-4.3 ms, 2.9-3.1 ms so (1, 4 and 8 rows
 * ahead: 3.2, 3.1, 3.3). */
#define ROWS_AHEAD 2

/* rows of bf16 x -> int8 codes [rows][K] and their scales; the codes XOR flip: 0x80 stores
 * them + 128, as vpdpbusd's unsigned operand, 0 as they are (AMX's signed tiles). 64 codes a
 * step narrow through two saturating packs and one dword permute (vpmovsdb, four to a step, was
 * twice the shuffles): packs leave each 128-bit lane holding dwords l, 4 + l, 8 + l, 12 + l.
 * No code stands for a NaN, nor for an inf under a row's own scale: such a row gets a NaN scale,
 * so that its outputs come out NaN, as torch's would, rather than finite and wrong. */
static void quantize_int8(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k_in,
                          const float *static_scale, uint8_t flip, int8_t *xq, float *scales) {
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * x_stride;
        if (r + ROWS_AHEAD < rows) prefetch_lines(row + ROWS_AHEAD * x_stride, k_in * 2);
        const float top = static_scale ? 0.0f : row_absmax(row, k_in);
        const float scale = static_scale ? *static_scale : fmaxf(top, 1e-12f) / 127.0f;
        const __m512 inv = _mm512_set1_ps(1.0f / scale);
        __mmask16 unordered = 0;
        for (int64_t k = 0; k < k_in; k += 64) {
            __m512i q[4];
            for (int g = 0; g < 4; g++) {  /* ties to even */
                __m512 v = _mm512_mul_ps(bf16x16_to_f32(row + k + 16 * g), inv);
                if (static_scale) {  /* can be exceeded: clamped before the conversion, which
                                        turns 2^31 and beyond into INT_MIN */
                    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
                }
                q[g] = _mm512_cvtps_epi32(v);
            }
            const __m512i bytes = _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
            _mm512_storeu_si512(xq + r * k_in + k,
                                _mm512_xor_si512(_mm512_permutexvar_epi32(order, bytes), _mm512_set1_epi8((char)flip)));
        }
        scales[r] = isfinite(top) && !unordered ? scale : NAN;
    }
}

/* 16 fp32 values, clamped to +-448, -> the nearest e4m3 value (ties to even), still fp32. */
static inline __m512 round_to_e4m3(__m512 v) {
    v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(FP8_MAX)), _mm512_set1_ps(-FP8_MAX));
    /* normal range (|v| >= 2^-6): keep 3 mantissa bits, rounding the 20 dropped ones to even */
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
    __m512i normal = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7ffff))),
                                      _mm512_set1_epi32((int)0xfff00000u));
    /* subnormal range: multiples of 2^-9 */
    __m512 sub = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(512.0f)),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                               _mm512_set1_ps(1.0f / 512.0f));
    __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(1.0f / 64.0f), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(normal), tiny, sub);
}

/* rows of bf16 x -> their fp8 values as bf16 [rows][K] (exact) and their scales, NaN where
 * quantize_int8's would be (round_to_e4m3 turns a NaN into 448). */
static void quantize_fp8(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k_in,
                         const float *static_scale, uint16_t *xq, float *scales) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * x_stride;
        if (r + ROWS_AHEAD < rows) prefetch_lines(row + ROWS_AHEAD * x_stride, k_in * 2);
        const float top = static_scale ? 0.0f : row_absmax(row, k_in);
        const float scale = static_scale ? *static_scale : fmaxf(top, 1e-12f) / FP8_MAX;
        const __m512 scale_v = _mm512_set1_ps(scale);
        __mmask16 unordered = 0;
        for (int64_t k = 0; k < k_in; k += 16) {
            const __m512 v = _mm512_div_ps(bf16x16_to_f32(row + k), scale_v);
            if (static_scale) unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            store_bf16(xq + r * k_in + k, round_to_e4m3(v));
        }
        scales[r] = isfinite(top) && !unordered ? scale : NAN;
    }
}

/* 32 e4m3 codes (16 outputs' k-pair) -> the same numbers as bf16 VNNI pairs, exactly. */
static inline __m512bh fp8_pair(const uint8_t *codes) {
    static const uint16_t subnormal[32] = {0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60};
    const __m512i magnitude_mask = _mm512_set1_epi16(0x7f);
    __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)codes));
    __m512i magnitude = _mm512_and_si512(c, magnitude_mask);
    __m512i bits = _mm512_add_epi16(_mm512_slli_epi16(magnitude, 4), _mm512_set1_epi16(120 << 7));
    __mmask32 tiny = _mm512_testn_epi16_mask(magnitude, _mm512_set1_epi16(0x78));  /* exponent 0 */
    bits = _mm512_mask_permutexvar_epi16(bits, tiny, magnitude, _mm512_loadu_si512(subnormal));
    __m512i sign = _mm512_slli_epi16(_mm512_andnot_si512(magnitude_mask, c), 8);
    return (__m512bh)_mm512_or_si512(bits, sign);
}

/* The TASK_BLOCKS 16-output blocks from b0 (an odd last block is read twice and written once)
 * for ROWS <= TILE_ROWS quantized rows; ROWS is a constant so the sums stay in registers. */
static inline __attribute__((always_inline)) void int8_blocks(
        const linear_t *l, const int8_t *xq, const float *x_scale, const int ROWS,
        uint16_t *y, int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, blocks = n / 16, quads = k / 4;
    const int nb = blocks - b0 < TASK_BLOCKS ? 1 : TASK_BLOCKS;
    const int8_t *w[2] = {(const int8_t *)l->weight + b0 * k * 16,
                          (const int8_t *)l->weight + (b0 + nb - 1) * k * 16};
    __v16si acc[2][2][TILE_ROWS];  /* see vnni_gemm.c's int8_tile_sums: not __m512i */
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < TASK_BLOCKS; b++)
            for (int m = 0; m < ROWS; m++) acc[p][b][m] = (__v16si)_mm512_setzero_si512();
    for (int64_t qd = 0; qd < quads; qd += 2) {
        for (int b = 0; b < TASK_BLOCKS; b++)
            _mm_prefetch(task_prefetch_at(w[b], (qd + 32) * 64, quads * 64, TASK_BLOCKS), _MM_HINT_T0);
        for (int p = 0; p < 2; p++) {
            __m512i xv[TILE_ROWS];
            for (int m = 0; m < ROWS; m++) {
                int32_t four;
                memcpy(&four, xq + m * k + 4 * (qd + p), 4);
                xv[m] = _mm512_set1_epi32(four);
            }
            for (int b = 0; b < TASK_BLOCKS; b++) {
                __m512i wv = _mm512_loadu_si512(w[b] + (qd + p) * 64);
                for (int m = 0; m < ROWS; m++)
                    acc[p][b][m] = (__v16si)_mm512_dpbusd_epi32((__m512i)acc[p][b][m], xv[m], wv);
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(l->weight_sums + col), 7);
        __m512 w_scale = _mm512_loadu_ps(l->scale + col), bias = bias_f32(l->bias ? l->bias + col : NULL);
        for (int m = 0; m < ROWS; m++) {
            __m512i sum = _mm512_sub_epi32(_mm512_add_epi32((__m512i)acc[0][b][m], (__m512i)acc[1][b][m]), offset);
            __m512 out = _mm512_mul_ps(_mm512_cvtepi32_ps(sum),
                                       _mm512_mul_ps(w_scale, _mm512_set1_ps(x_scale[m])));
            store_bf16(y + m * n + col, _mm512_add_ps(out, bias));
        }
    }
}

/* The TASK_BLOCKS 16-output blocks from b0, as int8_blocks, for ROWS <= TILE_ROWS rounded rows. */
static inline __attribute__((always_inline)) void fp8_blocks(
        const linear_t *l, const uint16_t *xq, const float *x_scale, const int ROWS,
        uint16_t *y, int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, blocks = n / 16;
    const int nb = blocks - b0 < TASK_BLOCKS ? 1 : TASK_BLOCKS;
    const uint8_t *w[2] = {(const uint8_t *)l->weight + b0 * k * 16,
                           (const uint8_t *)l->weight + (b0 + nb - 1) * k * 16};
    __m512 acc[2][2][TILE_ROWS];
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < TASK_BLOCKS; b++)
            for (int m = 0; m < ROWS; m++) acc[p][b][m] = _mm512_setzero_ps();
    for (int64_t pair = 0; pair < k / 2; pair += 2) {
        for (int b = 0; b < TASK_BLOCKS; b++)
            _mm_prefetch(task_prefetch_at(w[b], (pair + 64) * 32, k / 2 * 32, TASK_BLOCKS), _MM_HINT_T0);
        for (int p = 0; p < 2; p++) {
            __m512bh wv[2];
            for (int b = 0; b < TASK_BLOCKS; b++) wv[b] = fp8_pair(w[b] + (pair + p) * 32);
            for (int m = 0; m < ROWS; m++) {
                __m512bh xv = broadcast_pair(xq + m * k, pair + p);
                for (int b = 0; b < TASK_BLOCKS; b++)
                    acc[p][b][m] = _mm512_dpbf16_ps(acc[p][b][m], wv[b], xv);
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512 w_scale = _mm512_loadu_ps(l->scale + col), bias = bias_f32(l->bias ? l->bias + col : NULL);
        for (int m = 0; m < ROWS; m++) {
            __m512 sum = _mm512_add_ps(acc[0][b][m], acc[1][b][m]);
            __m512 out = _mm512_mul_ps(sum, _mm512_mul_ps(w_scale, _mm512_set1_ps(x_scale[m])));
            store_bf16(y + m * n + col, _mm512_add_ps(out, bias));
        }
    }
}

/* Row tiles of up to TILE_ROWS, each reading the weights once; the switch inside the parallel
 * loop gives every case constant kinds and ROWS (see quant_linear.c). xq: int8 codes, or fp8
 * values as bf16, [rows][K]. */
static void kernel_rows(const linear_t *l, const void *xq, const float *x_scale, int64_t rows,
                        uint16_t *y) {
    const int fp8 = l->kind == LINEAR_FP8;
    const int64_t code_bytes = fp8 ? 2 : 1;
    for (int64_t r = 0; r < rows; r += TILE_ROWS) {
        const int variant = fp8 * TILE_ROWS + (int)(rows - r < TILE_ROWS ? rows - r : TILE_ROWS) - 1;
        const void *xr = (const char *)xq + r * l->k_in * code_bytes;
        const float *sr = x_scale + r;
        uint16_t *yr = y + r * l->n_out;
        /* two blocks a task at every row count (see quant_linear.c): at one row, on an Intel
         * Xeon with AMX, FP8's linears took 4.39-4.41 ms against 4.79-4.85 with one block a
         * task, W8A8's the same (on an AMD EPYC, one block a task had been 0-19% faster) */
#pragma omp parallel for schedule(static)
        for (int64_t b0 = 0; b0 < l->n_out / 16; b0 += TASK_BLOCKS) {
            switch (variant) {
            case 0: int8_blocks(l, xr, sr, 1, yr, b0); break;
            case 1: int8_blocks(l, xr, sr, 2, yr, b0); break;
            case 2: int8_blocks(l, xr, sr, 3, yr, b0); break;
            case 3: int8_blocks(l, xr, sr, 4, yr, b0); break;
            case 4: fp8_blocks(l, xr, sr, 1, yr, b0); break;
            case 5: fp8_blocks(l, xr, sr, 2, yr, b0); break;
            case 6: fp8_blocks(l, xr, sr, 3, yr, b0); break;
            default: fp8_blocks(l, xr, sr, 4, yr, b0); break;
            }
        }
    }
}

/* A widen_t's blocks for an fp8 linear_t: output blocks [first, first + count), each code's
 * number as bf16 in matmul.c's layout (the same bytes per pair). */
static void fp8_blocks_widened(const void *weight, int64_t first, int64_t count, uint16_t *dst) {
    const linear_t *l = weight;
    const uint8_t *codes = (const uint8_t *)l->weight + first * (l->k_in / 2) * 32;
    for (int64_t p = 0; p < count * (l->k_in / 2); p++)
        _mm512_storeu_si512(dst + p * 32, (__m512i)fp8_pair(codes + p * 32));
}

/* More than TILE_ROWS rows: int8 tiles on the codes (AMX, or AVX512 register tiles), or bf16
 * tiles (the same) on the fp8 codes widened: on AMX a chunk at a time into each thread's L2
 * (widened_gemm; the model's linears at 16 rows 13.0 -> 10.7 ms, at 512 rows 54.5 ->
 * 52.8), else the whole weight once. glu (on AMX only, see dynamic_glu): y gets silu(gate) * up
 * of the N outputs. Returns 0, or -2 when out of memory. */
static int gemm_rows(const linear_t *l, const void *xq, const float *x_scale, int64_t rows,
                     uint16_t *y, int glu) {
    const int64_t k = l->k_in;
    if (l->kind == LINEAR_W8A8) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
        if (has_amx())
            return amx_gemm(xq, k, rows, l->weight, k, GEMM_INT8 | (glu ? GEMM_GLU : 0), x_scale,
                            l->scale, l->bias, y, 2, glu ? l->n_out / 2 : l->n_out);
#endif
        const gemm_args_t g = {xq, l->weight, k, k, l->n_out, 2, x_scale, l->scale, l->bias, y,
                               l->weight_sums};
        vnni_gemm(&g, rows);
        return 0;
    }
    const widen_t widen = {fp8_blocks_widened, l};
    if (glu)  /* dynamic_glu asks on AMX only */
        return widened_glu(xq, k, rows, &widen, k, x_scale, l->scale, l->bias, y, l->n_out / 2);
    return widened_gemm(xq, k, rows, &widen, k, x_scale, l->scale, l->bias, y, l->n_out);
}

/* y [rows, N] = quantized(x) [rows, K] @ W^T, scaled (+ bias), for LINEAR_W8A8 (K % 64 == 0)
 * and LINEAR_FP8 (K % 32 == 0); N % 16 == 0 (checked by the caller); with glu, see
 * dynamic_glu. Returns 0, or -2 when out of memory. */
static int dynamic_product(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                           uint16_t *y, int glu) {
    const int fp8 = l->kind == LINEAR_FP8;
    void *xq = alloc_lines((size_t)(rows * l->k_in * (fp8 ? 2 : 1)));
    float *scales = malloc(sizeof(float) * (size_t)rows);
    int status = xq && scales ? 0 : -2;
    if (!status) {
        if (fp8) quantize_fp8(x, x_stride, rows, l->k_in, l->input_scale, xq, scales);
        else quantize_int8(x, x_stride, rows, l->k_in, l->input_scale,
                           rows > TILE_ROWS && has_amx() ? 0 : 0x80, xq, scales);
        if (rows > TILE_ROWS) status = gemm_rows(l, xq, scales, rows, y, glu);
        else kernel_rows(l, xq, scales, rows, y);
    }
    free(xq);
    free(scales);
    return status;
}

int dynamic_linear(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *y) {
    return dynamic_product(l, x, x_stride, rows, y, 0);
}

/* y [rows, N/2] = silu(gate) * up of a W8A8 or FP8 gate_up layer's outputs (the gate's first),
 * as dynamic_linear and silu_and_mul give them, where amx_gemm takes the rows (see bf16_glu).
 * Returns 0, -2 when out of memory, or 1 (nothing done) where it does not. */
int dynamic_glu(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *y) {
    if ((l->kind != LINEAR_W8A8 && l->kind != LINEAR_FP8) || rows <= TILE_ROWS || !has_amx() || l->n_out % 32)
        return 1;
    return dynamic_product(l, x, x_stride, rows, y, 1);
}

int has_dynamic_linear(void) { return 1; }
#else
int has_dynamic_linear(void) { return 0; }
#endif

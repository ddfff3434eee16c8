/* Weight-only int8 and int4 linears (W8A16, W4A16) for bf16 activations, AVX512-BF16.
 *
 * Why: a decode step is bound by reading the weights; int8 halves and int4 quarters the bytes,
 * but only if the kernel turns codes into products faster than memory delivers them (on this
 * project's VM, about one 512-bit instruction per ns per core: benchmarks/simd_rate.py). Both
 * layouts decode a 64-byte line straight into VNNI pairs (as matmul.c's bf16 kernel, no
 * horizontal sums): bf16 pairs for vdpbf16ps, or int8 ones sign-extended for vpdpwssd:
 *
 *   int8 [N/16][K/2][16][2]: codes q, the bf16 layout with one byte per weight; a 16-output
 *        k-pair widens to fp32 and narrows to bf16, exactly (|q| <= 128).
 *   int4 [N/16][K/8][64] bytes: one line per 16 outputs and 8 inputs holding u = q + 8, placed
 *        (inferlab/quant/formats/vnni.py) so that a mask, a shift and four byte-unpacks against
 *        0x43 give the line's four k-pairs as bf16 words 0x43XY = 128 + u.
 *   scale fp32 [K/group][N]; zero (zero points, fp32, same shape) or NULL; bias bf16 [N] or NULL.
 *
 * Up to TILE_ROWS (4) rows go through the kernels below, in registers, the weights read once;
 * more rows dequantize the weight into matmul.c's bf16 layout once per call and take its AMX
 * path, which a prefill is bound by the arithmetic of.
 *
 * int4: each group's sum of x * (128 + u) = x * (136 + q) is kept apart, then
 * y += scale * (sum - (136 + zero) * sum(x over the group)).
 *
 * int8: integer products (vpdpwssd: pairs of int16 products summed into int32). The codes
 * sign-extend to int16 in one instruction per k-pair, against six to bring them to bf16, which
 * had kept W8A16 compute-bound at ~18 GB/s. The activations enter as int16 with one power-of-two
 * scale per block of up to 64 inputs, 2^(e - 14) for e the exponent of the block's largest |x|:
 * a bf16 value at most 2^7 times smaller than that largest keeps all its bits, a smaller one
 * rounds to a multiple of 2^(e - 14), off by at most 2^-15 of the block's largest.
 * y = scale * (sum(xq * q) - zero * sum(xq)) per group, xq the rounded inputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef __AVX512BF16__
#define TILE_ROWS 4
#define LINE 64 /* bytes of one block's weights per step; prefetched 2 KiB ahead */

static inline __m512bh int8_pair(const int8_t *p) {  /* 32 codes of a 16-output k-pair */
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* One 64-byte line of a 16-output block -> its k-pairs as bf16 VNNI vectors: int8, two pairs
 * of codes q; int4, four pairs of 128 + u. */
static inline __attribute__((always_inline)) void decode_line(const uint8_t *src, const int BITS,
                                                              __m512bh pairs[4]) {
    if (BITS == 8) {
        pairs[0] = int8_pair((const int8_t *)src);
        pairs[1] = int8_pair((const int8_t *)src + 32);
        return;
    }
    const __m512i nibble = _mm512_set1_epi8(0xf), exponent = _mm512_set1_epi8(0x43);
    __m512i bytes = _mm512_loadu_si512(src);
    __m512i low = _mm512_and_si512(bytes, nibble);
#ifdef __GFNI__  /* each byte shifted right by 4 in one instruction: an affine map over GF(2) */
    __m512i high = _mm512_gf2p8affine_epi64_epi8(bytes, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
    __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
#endif
    pairs[0] = (__m512bh)_mm512_unpacklo_epi8(low, exponent);
    pairs[1] = (__m512bh)_mm512_unpackhi_epi8(low, exponent);
    pairs[2] = (__m512bh)_mm512_unpacklo_epi8(high, exponent);
    pairs[3] = (__m512bh)_mm512_unpackhi_epi8(high, exponent);
}

/* int4: two 16-output blocks (b0, b0 + 1; an odd last block is read twice and written once)
 * for ROWS <= TILE_ROWS rows; ROWS is a constant so the tile stays in registers. */
static inline __attribute__((always_inline)) void int4_blocks(
        const linear_t *l, const uint16_t *x, int64_t x_stride, const int ROWS,
        const float *xsum, uint16_t *y, int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, groups = k / l->group, blocks = n / 16;
    const int64_t block_bytes = k * 8, lines_per_group = l->group * 8 / LINE;
    const int pairs_per_line = 4;
    const int nb = blocks - b0 < 2 ? 1 : 2;
    const uint8_t *w[2] = {(const uint8_t *)l->weight + b0 * block_bytes,
                           (const uint8_t *)l->weight + (b0 + nb - 1) * block_bytes};
    const float offset = 136.0f;
    __m512 out[2][TILE_ROWS];
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < ROWS; m++) out[b][m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 acc[2][2][TILE_ROWS];
        for (int p = 0; p < 2; p++)
            for (int b = 0; b < 2; b++)
                for (int m = 0; m < ROWS; m++) acc[p][b][m] = _mm512_setzero_ps();
        for (int64_t line = g * lines_per_group; line < (g + 1) * lines_per_group; line++) {
            __m512bh wv[2][4];
            for (int b = 0; b < 2; b++) {
                const uint8_t *src = w[b] + line * LINE;
                _mm_prefetch((const char *)src + 2048, _MM_HINT_T0);
                decode_line(src, 4, wv[b]);
            }
            for (int i = 0; i < pairs_per_line; i++) {
                const int64_t pair = line * pairs_per_line + i;
                for (int m = 0; m < ROWS; m++) {
                    __m512bh xv = broadcast_pair(x + m * x_stride, pair);
                    for (int b = 0; b < 2; b++)
                        acc[i & 1][b][m] = _mm512_dpbf16_ps(acc[i & 1][b][m], wv[b][i], xv);
                }
            }
        }
        for (int b = 0; b < 2; b++) {
            const int64_t col = (b0 + (b < nb ? b : 0)) * 16;
            __m512 scale = _mm512_loadu_ps(l->scale + g * n + col);
            __m512 shift = _mm512_set1_ps(offset);
            if (l->zero) shift = _mm512_add_ps(shift, _mm512_loadu_ps(l->zero + g * n + col));
            for (int m = 0; m < ROWS; m++) {
                __m512 sum = _mm512_add_ps(acc[0][b][m], acc[1][b][m]);
                sum = _mm512_fnmadd_ps(shift, _mm512_set1_ps(xsum[m * groups + g]), sum);
                out[b][m] = _mm512_fmadd_ps(scale, sum, out[b][m]);
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512 bias = bias_f32(l->bias ? l->bias + col : NULL);
        for (int m = 0; m < ROWS; m++) store_bf16(y + m * n + col, _mm512_add_ps(out[b][m], bias));
    }
}

/* Inputs per int16 activation scale: the largest power of two up to 64 dividing the group. */
static int64_t act_block(const linear_t *l) {
    int64_t block = 64;
    while (l->group % block) block /= 2;
    return block;
}

/* Rows of bf16 x -> int16 codes xq [rows][K], per-block scales xscale and sums of the rounded
 * inputs xsum [rows][K / block] (the header says how; the sums are a zero point's share).
 * Multiplying by a power of two is exact, so codes round only below 2^-8 of their block's
 * largest. */
static void quantize_act16(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k,
                           int64_t block, int16_t *xq, float *xscale, float *xsum) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t m = 0; m < rows; m++)
        for (int64_t b = 0; b < k / block; b++) {
            const uint16_t *src = x + m * x_stride + b * block;
            __mmask16 lanes = block < 16 ? (__mmask16)((1u << block) - 1) : 0xFFFF;
            __m512 top = _mm512_setzero_ps();
            for (int64_t i = 0; i < block; i += 16)
                top = _mm512_max_ps(top, _mm512_andnot_ps(sign, bf16x16_widen(
                          _mm256_maskz_loadu_epi16(lanes, src + i))));
            float largest = _mm512_reduce_max_ps(top);
            int e = largest > 0.0f ? ilogbf(largest) : 0;
            e = e < -100 ? -100 : e;  /* 2^(14 - e) stays finite */
            __m512 up = _mm512_set1_ps(ldexpf(1.0f, 14 - e));
            __m512i codes = _mm512_setzero_si512();
            for (int64_t i = 0; i < block; i += 16) {
                __m512 v = bf16x16_widen(_mm256_maskz_loadu_epi16(lanes, src + i));
                __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, up));
                codes = _mm512_add_epi32(codes, q);
                _mm256_mask_storeu_epi16(xq + m * k + b * block + i, lanes, _mm512_cvtsepi32_epi16(q));
            }
            xscale[m * (k / block) + b] = ldexpf(1.0f, e - 14);
            xsum[m * (k / block) + b] = ldexpf((float)_mm512_reduce_add_epi32(codes), e - 14);
        }
}

/* int4_blocks' counterpart for int8 codes and int16 activations: per activation block, sums of
 * q * xq (at most 32 k-pairs of 2^7 * 2^15: below 2^28), then scaled into the group's fp32 sum. */
static inline __attribute__((always_inline)) void int8_blocks(
        const linear_t *l, const int16_t *xq, const float *xscale, const float *xsum,
        int64_t block, const int ROWS, uint16_t *y, int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, blocks = n / 16, act_blocks = k / block;
    const int nb = blocks - b0 < 2 ? 1 : 2;
    const int8_t *w[2] = {(const int8_t *)l->weight + b0 * k * 16,
                          (const int8_t *)l->weight + (b0 + nb - 1) * k * 16};
    __m512 out[2][TILE_ROWS];
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < ROWS; m++) out[b][m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k / l->group; g++) {
        __m512 sum[2][TILE_ROWS];
        float group_xsum[TILE_ROWS] = {0};
        for (int b = 0; b < 2; b++)
            for (int m = 0; m < ROWS; m++) sum[b][m] = _mm512_setzero_ps();
        for (int64_t a = g * (l->group / block); a < (g + 1) * (l->group / block); a++) {
            for (int m = 0; m < ROWS; m++) group_xsum[m] += xsum[m * act_blocks + a];
            __m512i acc[2][2][TILE_ROWS];  /* two chains per output: vpdpwssd's latency */
            for (int p = 0; p < 2; p++)
                for (int b = 0; b < 2; b++)
                    for (int m = 0; m < ROWS; m++) acc[p][b][m] = _mm512_setzero_si512();
            for (int64_t pair = a * block / 2; pair < (a + 1) * block / 2; pair++) {
                __m512i wv[2];
                for (int b = 0; b < 2; b++) {
                    const int8_t *src = w[b] + pair * 32;
                    if (!(pair & 1)) _mm_prefetch((const char *)src + 2048, _MM_HINT_T0);
                    wv[b] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)src));
                }
                for (int m = 0; m < ROWS; m++) {
                    int32_t two;
                    memcpy(&two, xq + m * k + 2 * pair, 4);
                    __m512i xv = _mm512_set1_epi32(two);
                    for (int b = 0; b < 2; b++)
                        acc[pair & 1][b][m] = _mm512_dpwssd_epi32(acc[pair & 1][b][m], wv[b], xv);
                }
            }
            for (int b = 0; b < 2; b++)
                for (int m = 0; m < ROWS; m++)
                    sum[b][m] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(_mm512_add_epi32(acc[0][b][m], acc[1][b][m])),
                        _mm512_set1_ps(xscale[m * act_blocks + a]), sum[b][m]);
        }
        for (int b = 0; b < 2; b++) {
            const int64_t col = (b0 + (b < nb ? b : 0)) * 16;
            __m512 scale = _mm512_loadu_ps(l->scale + g * n + col);
            for (int m = 0; m < ROWS; m++) {
                __m512 s = sum[b][m];
                if (l->zero)
                    s = _mm512_fnmadd_ps(_mm512_loadu_ps(l->zero + g * n + col),
                                         _mm512_set1_ps(group_xsum[m]), s);
                out[b][m] = _mm512_fmadd_ps(scale, s, out[b][m]);
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512 bias = bias_f32(l->bias ? l->bias + col : NULL);
        for (int m = 0; m < ROWS; m++) store_bf16(y + m * n + col, _mm512_add_ps(out[b][m], bias));
    }
}

/* Sums of x over each group, per row: the int4 offset's and zero point's share. */
static void group_sums(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                       float *xsum) {
    const int64_t groups = l->k_in / l->group;
    for (int64_t m = 0; m < rows; m++)
        for (int64_t g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int64_t i = g * l->group; i < (g + 1) * l->group; i++)
                s += bf16_to_f32(x[m * x_stride + i]);
            xsum[m * groups + g] = s;
        }
}

/* Up to TILE_ROWS rows, reading the weights once. The switch sits inside the parallel loop so
 * that every case inlines its kernel with a constant ROWS: a constant passed into the loop from
 * outside reaches OpenMP's outlined body as a variable. Returns 0, or -2 when out of memory. */
static int int8_kernel(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                       uint16_t *y) {
    const int64_t k = l->k_in, block = act_block(l);
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(rows * k));
    float *xscale = malloc(2 * sizeof(float) * (size_t)(rows * (k / block)));
    if (!xq || !xscale) {
        free(xq);
        free(xscale);
        return -2;
    }
    float *xsum = xscale + rows * (k / block);
    quantize_act16(x, x_stride, rows, k, block, xq, xscale, xsum);
#pragma omp parallel for schedule(static)
    for (int64_t b0 = 0; b0 < l->n_out / 16; b0 += 2) {
        switch (rows) {
        case 1: int8_blocks(l, xq, xscale, xsum, block, 1, y, b0); break;
        case 2: int8_blocks(l, xq, xscale, xsum, block, 2, y, b0); break;
        case 3: int8_blocks(l, xq, xscale, xsum, block, 3, y, b0); break;
        default: int8_blocks(l, xq, xscale, xsum, block, 4, y, b0); break;
        }
    }
    free(xq);
    free(xscale);
    return 0;
}

static int quant_kernel(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                        uint16_t *y) {
    if (l->kind == LINEAR_INT8) return int8_kernel(l, x, x_stride, rows, y);
    float xsum[TILE_ROWS * (l->k_in / l->group)];
    group_sums(l, x, x_stride, rows, xsum);
#pragma omp parallel for schedule(static)
    for (int64_t b0 = 0; b0 < l->n_out / 16; b0 += 2) {
        switch (rows) {
        case 1: int4_blocks(l, x, x_stride, 1, xsum, y, b0); break;
        case 2: int4_blocks(l, x, x_stride, 2, xsum, y, b0); break;
        case 3: int4_blocks(l, x, x_stride, 3, xsum, y, b0); break;
        default: int4_blocks(l, x, x_stride, 4, xsum, y, b0); break;
        }
    }
    return 0;
}

/* The weight as bf16 in matmul.c's layout [N/16][K/2][16][2]: (v - offset - zero) * scale from
 * the kernels' own bf16 values v (q, or 128 + u: offset 0 or 136). A k-pair's 32 values widen
 * to fp32 as outputs 0-7 and 8-15, two inputs each, so the per-output scales are spread the
 * same way, once per group. */
static inline __attribute__((always_inline)) void dequantize_block(
        const linear_t *l, const int BITS, int64_t b, uint16_t *packed) {
    const int64_t n = l->n_out, k = l->k_in, pairs = k / 2, pairs_per_line = BITS == 8 ? 2 : 4;
    const int64_t lines_per_group = l->group / (2 * pairs_per_line);
    const uint8_t *src = (const uint8_t *)l->weight + b * k * 16 * BITS / 8;
    const __m512i spread[2] = {
        _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8)};
    for (int64_t g = 0; g < k / l->group; g++) {
        __m512 scale = _mm512_loadu_ps(l->scale + g * n + b * 16);
        __m512 shift = _mm512_set1_ps(BITS == 8 ? 0.0f : 136.0f);
        if (l->zero) shift = _mm512_add_ps(shift, _mm512_loadu_ps(l->zero + g * n + b * 16));
        shift = _mm512_mul_ps(shift, scale);
        __m512 s[2], z[2];
        for (int h = 0; h < 2; h++) {
            s[h] = _mm512_permutexvar_ps(spread[h], scale);
            z[h] = _mm512_permutexvar_ps(spread[h], shift);
        }
        for (int64_t line = g * lines_per_group; line < (g + 1) * lines_per_group; line++) {
            __m512bh v[4];
            decode_line(src + line * LINE, BITS, v);
            for (int i = 0; i < pairs_per_line; i++) {
                __m512i words = (__m512i)v[i];
                __m512 w[2];
                for (int h = 0; h < 2; h++) {
                    __m256i half = h ? _mm512_extracti64x4_epi64(words, 1) : _mm512_castsi512_si256(words);
                    w[h] = _mm512_fmsub_ps(bf16x16_widen(half), s[h], z[h]);
                }
                _mm512_storeu_si512(packed + (b * pairs + line * pairs_per_line + i) * 32,
                                    (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
            }
        }
    }
}

static void dequantize_vnni(const linear_t *l, uint16_t *packed) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < l->n_out / 16; b++) {
        if (l->kind == LINEAR_INT8) dequantize_block(l, 8, b, packed);
        else dequantize_block(l, 4, b, packed);
    }
}

/* y [rows, N] = x [rows, K] (row stride x_stride) @ W^T (+ bias), for any kind of linear_t.
 * Returns 0, or -2 when out of memory. */
int linear_forward(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                   uint16_t *y) {
    if (l->kind == LINEAR_BF16)
        return bf16_linear(x, x_stride, rows, l->weight, l->bias, y, l->n_out, l->k_in);
#ifdef __AVX512VNNI__
    if (l->kind == LINEAR_W8A8 || l->kind == LINEAR_FP8) return dynamic_linear(l, x, x_stride, rows, y);
#endif
    if (rows <= TILE_ROWS) return quant_kernel(l, x, x_stride, rows, y);
    uint16_t *packed = aligned_alloc(64, (size_t)l->n_out * l->k_in * 2);
    if (!packed) return -2;
    dequantize_vnni(l, packed);
    int status = bf16_linear(x, x_stride, rows, packed, l->bias, y, l->n_out, l->k_in);
    free(packed);
    return status;
}

int has_quant_linear(void) { return 1; }
#else
int has_quant_linear(void) { return 0; }
#endif

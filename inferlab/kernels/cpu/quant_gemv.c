/* Weight-only int4 matrix-vector kernel for decode rows (up to 4), AVX512.
 *
 * Why: a decode step is bound by reading the weights, and int4 quarters the bytes; this reads
 * the tensors torch's CPU kernel (_weight_int4pack_mm_for_cpu) takes, faster than it at a few
 * rows, so a layer keeps one copy and larger batches still go to torch:
 *
 *   torch's CPU int4 layout with 64-output blocks, [N/64][K][32] bytes, byte j of a row
 *   holding output j in its low nibble and output j + 32 in its high one, unsigned (u = q + 8);
 *   bf16 (scale, zero) pairs [K/G, N, 2]: w = (u - 8) * scale + zero.
 *
 * (An int8 kernel written the same way, widening each weight to fp32, ran slower than torch's
 * _weight_int8pack_mm here: the conversions, not the memory, bound it.)
 *
 * Products and sums are fp32; x is widened to fp32 once per call. A row's result does not
 * depend on the other rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef __AVX512F__
#include <immintrin.h>

#define QUANT_MAX_ROWS 4

/* rows x [K] of bf16 (elem 2) or fp32 (elem 4), row stride x_stride -> fp32 [rows][K]. */
static float *widen_rows(const void *x, int64_t x_stride, int elem, int64_t rows, int64_t k_in) {
    float *xf = malloc(sizeof(float) * (size_t)(rows * k_in));
    for (int64_t m = 0; xf && m < rows; m++)
        load_f32((const char *)x + m * x_stride * elem, elem, xf + m * k_in, k_in);
    return xf;
}

static inline __m512 bf16_pairs_low(__m512i pairs) {  /* the first bf16 of each 32-bit pair */
    return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}

static inline __m512 bf16_pairs_high(__m512i pairs) {  /* the second */
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u)));
}

/* One 64-output block: per group, sums of x * u in registers, then
 * y += scale * (sum - 8 * xsum) + zero * xsum with xsum the group's sum of x. */
static inline __attribute__((always_inline)) void int4_block(
        const float *xf, const float *xsum, const int ROWS, const uint8_t *block,
        const uint16_t *scales_zeros, int64_t group, float *y, int64_t n_out, int64_t k_in,
        int64_t n0) {
    __m512 out[QUANT_MAX_ROWS][4];
    const __m512i low4 = _mm512_set1_epi32(15);
    const __m512 eight = _mm512_set1_ps(8.0f);
    for (int m = 0; m < ROWS; m++)
        for (int j = 0; j < 4; j++) out[m][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k_in / group; g++) {
        __m512 acc[QUANT_MAX_ROWS][4];
        for (int m = 0; m < ROWS; m++)
            for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
        for (int64_t k = g * group; k < (g + 1) * group; k++) {
            const uint8_t *p = block + k * 32;
            __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
            __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16)));
            __m512 w[4] = {_mm512_cvtepi32_ps(_mm512_and_si512(lo, low4)),   /* outputs 0-15 */
                           _mm512_cvtepi32_ps(_mm512_and_si512(hi, low4)),   /* 16-31 */
                           _mm512_cvtepi32_ps(_mm512_srli_epi32(lo, 4)),     /* 32-47 */
                           _mm512_cvtepi32_ps(_mm512_srli_epi32(hi, 4))};    /* 48-63 */
            for (int m = 0; m < ROWS; m++) {
                __m512 xb = _mm512_set1_ps(xf[m * k_in + k]);
                for (int j = 0; j < 4; j++) acc[m][j] = _mm512_fmadd_ps(w[j], xb, acc[m][j]);
            }
        }
        for (int j = 0; j < 4; j++) {
            __m512i pairs = _mm512_loadu_si512(scales_zeros + (g * n_out + n0 + 16 * j) * 2);
            __m512 scale = bf16_pairs_low(pairs), zero = bf16_pairs_high(pairs);
            for (int m = 0; m < ROWS; m++) {
                __m512 xs = _mm512_set1_ps(xsum[m * (k_in / group) + g]);
                __m512 centred = _mm512_fnmadd_ps(eight, xs, acc[m][j]);  /* sum(x u) - 8 sum(x) */
                out[m][j] = _mm512_fmadd_ps(scale, centred, _mm512_fmadd_ps(zero, xs, out[m][j]));
            }
        }
    }
    for (int m = 0; m < ROWS; m++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(y + m * n_out + n0 + 16 * j, out[m][j]);
}

/* y [rows, N] fp32 from torch's int4 layout (see the top); N a multiple of 64, group | K,
 * bf16 scales and zeros. Returns 0, -1 for more than QUANT_MAX_ROWS rows, -2 when out of memory. */
int int4_gemv(const void *x, int64_t x_stride, int elem, int64_t rows, const uint8_t *packed,
              const uint16_t *scales_zeros, int64_t group, float *y, int64_t n_out, int64_t k_in) {
    if (rows < 1 || rows > QUANT_MAX_ROWS) return -1;
    int64_t groups = k_in / group;
    float *xf = widen_rows(x, x_stride, elem, rows, k_in);
    float *xsum = malloc(sizeof(float) * (size_t)(rows * groups));
    if (!xf || !xsum) {
        free(xf);
        free(xsum);
        return -2;
    }
    for (int64_t m = 0; m < rows; m++)
        for (int64_t g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int64_t k = g * group; k < (g + 1) * group; k++) s += xf[m * k_in + k];
            xsum[m * groups + g] = s;
        }
#define BLOCKS(R)                                                                             \
    _Pragma("omp parallel for schedule(static)")                                             \
    for (int64_t b = 0; b < n_out / 64; b++)                                                 \
        int4_block(xf, xsum, R, packed + b * k_in * 32, scales_zeros, group, y, n_out, \
                   k_in, b * 64)
    switch (rows) {
    case 1: BLOCKS(1); break;
    case 2: BLOCKS(2); break;
    case 3: BLOCKS(3); break;
    default: BLOCKS(4); break;
    }
#undef BLOCKS
    free(xf);
    free(xsum);
    return 0;
}

int has_quant_gemv(void) { return 1; }
#else
int has_quant_gemv(void) { return 0; }
#endif

/* W8A8 linears for fp32 activations on AVX2 CPUs without VNNI (e.g. AMD EPYC Zen 3): each row
 * of x quantized to int8 per token (or with one static scale), int8 weights per output channel,
 * the products summed exactly in int32 with vpmaddwd, then y = sum * x_scale * w_scale (+ bias):
 * the bits of the int8 GEMM reference (Int8DynamicLinear on torch._int_mm), whatever the batch.
 *
 * Why: without VNNI, oneDNN's int8 GEMM saturates 16-bit sums (inexact) and torch._int_mm takes
 * its slow path (4.4 s for the embedded model's 64-token prefill on a Zen 3). vpmaddwd multiplies
 * 16 pairs of int16 and adds adjacent products into 8 int32 lanes: on the Zen 3, 12 independent
 * vpmaddwd + vpaddd chains retire one pair per 0.255 ns (16 products) against 0.20 ns for an
 * fp32 FMA (8): 1.6x the products a cycle, with no dequantizing on the way.
 *
 * Layout (inferlab/quant/formats/avx2_blocks.py pack_pairs): blocks of 8 outputs, and in a
 * block, per pair of inputs, the 8 outputs' two codes side by side, [N/8, K/2, 8, 2] int8: 16
 * bytes a pair that one vpmovsxbw widens to the 16 int16 a vpmaddwd takes against the pair
 * (x[2p], x[2p + 1]) of a row broadcast as one 32-bit lane. scale fp32 [N/8 * 8], zeros past
 * n_out. A tile is FP32-like: 3 blocks by 4 rows, 12 int32 accumulators.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define W8A8_BLOCKS 3
#define W8A8_ROWS 4

/* Row r's codes (int16, the pairs read as int32) and its scale: absmax / 127 (at least 1e-12 /
 * 127) and round(x / scale) to nearest even, or the static scale and codes clamped to [-128,
 * 127]; the same fp32 operations as scaled_mm.activation_scale and _int8_codes. */
static void quantize_row(const float *x, int64_t k_in, const float *static_scale, int16_t *codes,
                         float *scale) {
    float s;
    if (static_scale) {
        s = *static_scale;
    } else {
        __m256 top = _mm256_setzero_ps();
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int64_t k = 0; k < k_in; k += 8)
            top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(x + k), magnitude));
        float lanes[8], absmax = 0.0f;
        _mm256_storeu_ps(lanes, top);
        for (int i = 0; i < 8; i++) absmax = lanes[i] > absmax ? lanes[i] : absmax;
        s = (absmax > 1e-12f ? absmax : 1e-12f) / 127.0f;
    }
    *scale = s;
    const __m256 sv = _mm256_set1_ps(s), low = _mm256_set1_ps(-128.0f), high = _mm256_set1_ps(127.0f);
    for (int64_t k = 0; k < k_in; k += 8) {
        __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + k), sv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm256_min_ps(_mm256_max_ps(q, low), high);  /* dynamic codes already lie within */
        const __m256i q32 = _mm256_cvtps_epi32(q);
        _mm_storeu_si128((__m128i *)(codes + k),
                         _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1)));
    }
}

/* y [ROWS, the 8 * BLOCKS outputs from block b] for rows of int16 codes (k_in apart). */
static inline __attribute__((always_inline)) void w8a8_tile(const avx2_qlinear_t *l, int64_t b,
                                                            const int16_t *codes, const float *x_scale,
                                                            float *y, const int BLOCKS, const int ROWS) {
    const int64_t k_in = l->k_in, pairs = k_in / 2;
    const int8_t *w = (const int8_t *)l->codes + b * k_in * 8;
    __m256i acc[W8A8_ROWS][W8A8_BLOCKS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int64_t p = 0; p < pairs; p++) {
        __m256i wp[W8A8_BLOCKS];
        for (int c = 0; c < BLOCKS; c++)
            wp[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + (c * pairs + p) * 16)));
        for (int r = 0; r < ROWS; r++) {
            const __m256i xr = _mm256_set1_epi32(*(const int32_t *)(codes + r * k_in + 2 * p));
            for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(wp[c], xr));
        }
    }
    for (int c = 0; c < BLOCKS; c++) {
        const int64_t first = (b + c) * 8, count = l->n_out - first < 8 ? l->n_out - first : 8;
        const __m256 w_scale = _mm256_loadu_ps(l->scale + first);
        for (int r = 0; r < ROWS; r++) {
            const __m256 sum = _mm256_cvtepi32_ps(acc[r][c]);  /* as torch's int32 -> fp32 */
            float lanes[8];
            _mm256_storeu_ps(lanes, _mm256_mul_ps(_mm256_mul_ps(sum, _mm256_set1_ps(x_scale[r])), w_scale));
            for (int64_t j = 0; j < count; j++)
                y[r * l->n_out + first + j] = lanes[j] + (l->bias ? l->bias[first + j] : 0.0f);
        }
    }
}

typedef void w8a8_tile_fn(const avx2_qlinear_t *, int64_t, const int16_t *, const float *, float *);
#define W8A8_TILE(BLOCKS, ROWS)                                                                    \
    static void w8a8_tile_##BLOCKS##_##ROWS(const avx2_qlinear_t *l, int64_t b, const int16_t *codes, \
                                            const float *x_scale, float *y) {                     \
        w8a8_tile(l, b, codes, x_scale, y, BLOCKS, ROWS);                                         \
    }
#define W8A8_TILES(BLOCKS) W8A8_TILE(BLOCKS, 1) W8A8_TILE(BLOCKS, 2) W8A8_TILE(BLOCKS, 3) W8A8_TILE(BLOCKS, 4)
W8A8_TILES(1)
W8A8_TILES(2)
W8A8_TILES(3)
static w8a8_tile_fn *const W8A8_TILE_KERNELS[W8A8_BLOCKS][W8A8_ROWS] = {
    {w8a8_tile_1_1, w8a8_tile_1_2, w8a8_tile_1_3, w8a8_tile_1_4},
    {w8a8_tile_2_1, w8a8_tile_2_2, w8a8_tile_2_3, w8a8_tile_2_4},
    {w8a8_tile_3_1, w8a8_tile_3_2, w8a8_tile_3_3, w8a8_tile_3_4},
};

/* y [rows, N] = the W8A8 product of x [rows, K] (row stride x_stride) with the layer (act_bits
 * 8). Returns 0, or -1 when the codes' scratch memory could not be allocated. */
int avx2_w8a8_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows, float *y) {
    const int64_t k_in = l->k_in, blocks = (l->n_out + 7) / 8;
    int16_t *codes = alloc_lines(sizeof(int16_t) * (size_t)(rows * k_in));
    float *x_scale = malloc(sizeof(float) * (size_t)rows);
    if (!codes || !x_scale) {
        free(codes);
        free(x_scale);
        return -1;
    }
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            quantize_row(x + r * x_stride, k_in, l->input_scale, codes + r * k_in, x_scale + r);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b += W8A8_BLOCKS) {
            w8a8_tile_fn *const *kernels = W8A8_TILE_KERNELS[(blocks - b < W8A8_BLOCKS ? blocks - b : W8A8_BLOCKS) - 1];
            for (int64_t r = 0; r < rows; r += W8A8_ROWS) {
                const int64_t tile = rows - r < W8A8_ROWS ? rows - r : W8A8_ROWS;
                kernels[tile - 1](l, b, codes + r * k_in, x_scale + r, y + r * l->n_out);
            }
        }
    }
    free(codes);
    free(x_scale);
    return 0;
}
#endif

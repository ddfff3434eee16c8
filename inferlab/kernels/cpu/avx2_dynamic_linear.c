/* Linears whose activations are quantized per call (or with one static scale), for fp32
 * activations on AVX2 CPUs (e.g. AMD EPYC Zen 3): W8A8 (int8 weights and activations) and
 * FP8_DYNAMIC / FP8 (fp8 e4m3 weights and activations). Each row of x is quantized in C, the
 * weights are per output channel, and y = sum * x_scale * w_scale (+ bias), the sums exact
 * products: each row's result is the same whatever rows are beside it.
 *
 * W8A8: the bits of the int8 GEMM reference (Int8DynamicLinear on torch._int_mm). Why: without
 * VNNI, oneDNN's int8 GEMM saturates 16-bit sums (inexact) and torch._int_mm takes its slow path
 * (4.4 s for the embedded model's 64-token prefill on a Zen 3). vpmaddwd multiplies 16 pairs of
 * int16 and adds adjacent products into 8 int32 lanes: on the Zen 3, 12 independent vpmaddwd +
 * vpaddd chains retire one pair per 0.255 ns (16 products) against 0.20 ns for an fp32 FMA (8):
 * 1.6x the products a cycle, with no dequantizing on the way.
 *
 * Layout (inferlab/kernels/avx2_blocks.py pack_pairs): blocks of 8 outputs, and in a
 * block, per pair of inputs, the 8 outputs' two codes side by side, [N/8, K/2, 8, 2] int8: 16
 * bytes a pair that one vpmovsxbw widens to the 16 int16 a vpmaddwd takes against the pair
 * (x[2p], x[2p + 1]) of a row broadcast as one 32-bit lane. A tile is 3 blocks by 4 rows, 12
 * int32 accumulators.
 *
 * FP8: x rounds as the torch reference (Fp8DynamicLinear) rounds it: scale_r = max(absmax_r,
 * 1e-12) / 448, v = x / scale_r (a division), clamped to +-448, to the nearest e4m3 value (ties
 * to even), kept as fp32. Every product of two e4m3 values is exact in fp32, so the FMAs sum
 * exact products as the reference's fp32 GEMM does (in its own order: equal within fp32
 * rounding, not in bits). Why: torch's path widened the whole fp8 weight to fp32 in every call:
 * the embedded model decoded at 0.05x dense fp32 on a Zen 3. Codes [N/8, K, 8] (pack_codes' int8
 * layout, one byte each), widened in 4 instructions per 8 (fp8_values); tiles of 3 blocks by 4
 * rows as the dense fp32 ones (avx2_quant_linear.c), each output one chain over k in order.
 *
 * scale fp32 [N/8 * 8], zeros past n_out.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* the dense tiles' shape (kernels.h): FP8's tiles run their loop, W8A8's take the same */
#define DYNAMIC_BLOCKS FP32_BLOCKS
#define DYNAMIC_ROWS FP32_ROWS
#define FP8_MAX 448.0f
/* fp8_values reads a code's value times 2^-120; the rounded activations are
 * kept times 2^64 (FP8_X_SCALE), so that each product is the exact one times 2^-56, within fp32's
 * normal range for every pair of e4m3 values (down to 2^-18 * 2^-56), and the sums are exactly
 * 2^-56 times what they would be: FP8_SUM_SCALE takes them back. */
#define FP8_X_SCALE 0x1p64f
#define FP8_SUM_SCALE 0x1p56f

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

/* 8 fp32 values, clamped to +-448, -> the nearest e4m3 value (ties to even), still fp32: in the
 * normal range (|v| >= 2^-6) 3 mantissa bits kept, the 20 dropped rounded to even; below it,
 * multiples of 2^-9. A NaN comes out 448 (its row's scale is NaN, see quantize_row_fp8). */
static inline __m256 round_to_e4m3(__m256 v) {
    v = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(FP8_MAX)), _mm256_set1_ps(-FP8_MAX));
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 20), _mm256_set1_epi32(1));
    const __m256i normal = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7ffff))),
                                            _mm256_set1_epi32((int)0xfff00000u));
    const __m256 sub = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(512.0f)),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                     _mm256_set1_ps(1.0f / 512.0f));
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(1.0f / 64.0f),
                                      _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, tiny);
}

/* Row r's fp8 values (fp32) and its scale, as Fp8DynamicLinear rounds them; a row holding a NaN
 * or an inf (dynamic), or giving a NaN against the static scale, gets a NaN scale so that its
 * outputs are NaN, as torch's are. The absmax compares the magnitudes' bits as integers: NaN's
 * are the largest, as torch's amax gives it. */
static void quantize_row_fp8(const float *x, int64_t k_in, const float *static_scale, float *values,
                             float *scale) {
    float s;
    int unordered = 0;
    if (static_scale) {
        s = *static_scale;
    } else {
        __m256i top = _mm256_setzero_si256();
        for (int64_t k = 0; k < k_in; k += 8)
            top = _mm256_max_epu32(top, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + k)),
                                                         _mm256_set1_epi32(0x7fffffff)));
        uint32_t lanes[8], most = 0;
        _mm256_storeu_si256((__m256i *)lanes, top);
        for (int i = 0; i < 8; i++) most = lanes[i] > most ? lanes[i] : most;
        float absmax;
        memcpy(&absmax, &most, sizeof absmax);
        unordered = !isfinite(absmax);
        s = fmaxf(absmax, 1e-12f) / FP8_MAX;
    }
    const __m256 sv = _mm256_set1_ps(s);
    __m256 nan = _mm256_setzero_ps();
    for (int64_t k = 0; k < k_in; k += 8) {
        const __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + k), sv);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        _mm256_storeu_ps(values + k, _mm256_mul_ps(round_to_e4m3(v), _mm256_set1_ps(FP8_X_SCALE)));
    }
    *scale = unordered || _mm256_movemask_ps(nan) ? NAN : s;
}

/* The 8 e4m3 codes at `codes` -> their values times 2^-120 in fp32, exactly: the sign-extended
 * byte shifted so that its exponent and mantissa land in fp32's (the sign bit kept, the copies of
 * it between masked off) and read with fp32's bias (127, not 7); exponent 0, e4m3's subnormals
 * m * 2^-9, reads as the fp32 denormal m * 2^-129. Three instructions, as int8's widening takes
 * (0x1p120 times it, exact, was a fourth: FP8_X_SCALE makes up for it). */
static inline __attribute__((always_inline)) __m256 fp8_values(const uint8_t *codes) {
    const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 20), _mm256_set1_epi32((int)0x87f00000u)));
}

/* Outputs [first, first + 8) of a row (those below n_out): (sum * x_scale) * w_scale + bias. */
static inline __attribute__((always_inline)) void store_scaled(const avx2_qlinear_t *l, int64_t first,
                                                               __m256 sum, float x_scale, float *y_row) {
    const int64_t count = l->n_out - first < 8 ? l->n_out - first : 8;
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_mul_ps(_mm256_mul_ps(sum, _mm256_set1_ps(x_scale)),
                                          _mm256_loadu_ps(l->scale + first)));
    for (int64_t j = 0; j < count; j++) y_row[first + j] = lanes[j] + (l->bias ? l->bias[first + j] : 0.0f);
}

/* y [ROWS, the 8 * BLOCKS outputs from block b] for rows of int16 codes (k_in apart). */
static inline __attribute__((always_inline)) void w8a8_tile(const avx2_qlinear_t *l, int64_t b,
                                                            const void *xq, const float *x_scale,
                                                            float *y, const int BLOCKS, const int ROWS) {
    const int64_t k_in = l->k_in, pairs = k_in / 2;
    const int16_t *codes = xq;
    const int8_t *w = (const int8_t *)l->codes + b * k_in * 8;
    __m256i acc[DYNAMIC_ROWS][DYNAMIC_BLOCKS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int64_t p = 0; p < pairs; p++) {
        __m256i wp[DYNAMIC_BLOCKS];
        for (int c = 0; c < BLOCKS; c++)
            wp[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + (c * pairs + p) * 16)));
        for (int r = 0; r < ROWS; r++) {
            const __m256i xr = _mm256_set1_epi32(*(const int32_t *)(codes + r * k_in + 2 * p));
            for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(wp[c], xr));
        }
    }
    for (int c = 0; c < BLOCKS; c++)
        for (int r = 0; r < ROWS; r++)  /* int32 -> fp32 as torch's */
            store_scaled(l, (b + c) * 8, _mm256_cvtepi32_ps(acc[r][c]), x_scale[r], y + r * l->n_out);
}

/* FP8, y [ROWS, the 8 * BLOCKS outputs from block b] for rows of fp8 values (fp32, k_in apart),
 * each output one chain over k in order, as fp32_tile_sums sums: one row decodes the codes as
 * it reads them (3 sums); more read the blocks' values that fp8_widen wrote to `wide`, since a
 * tile of 4 rows decoding its own kept 12 sums, 3 weights and the decoding's constants in 16
 * registers by spilling (2.5x the dense fp32 tile's time). Both give a row the same bits. */
static inline __attribute__((always_inline)) void fp8_tile(const avx2_qlinear_t *l, int64_t b,
                                                           const void *xq, const float *x_scale,
                                                           const float *wide, float *y, const int BLOCKS,
                                                           const int ROWS) {
    const int64_t k_in = l->k_in;
    const float *values = xq;
    __m256 acc[FP32_ROWS][FP32_BLOCKS];
    if (ROWS > 1) {
        fp32_tile_sums(wide, k_in, values, k_in, acc, BLOCKS, ROWS, 0);
    } else {
        const uint8_t *w = l->codes + b * k_in * 8;
        for (int c = 0; c < BLOCKS; c++) acc[0][c] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int64_t k = 0; k < k_in; k++) {
            const __m256 xr = _mm256_broadcast_ss(values + k);
            for (int c = 0; c < BLOCKS; c++)
                acc[0][c] = _mm256_fmadd_ps(fp8_values(w + (c * k_in + k) * 8), xr, acc[0][c]);
        }
    }
    /* unrolled whole: a variable index keeps the sums in memory, stored at every FMA */
#pragma GCC unroll 3
    for (int c = 0; c < BLOCKS; c++)
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++)
            store_scaled(l, (b + c) * 8, _mm256_mul_ps(acc[r][c], _mm256_set1_ps(FP8_SUM_SCALE)), x_scale[r],
                         y + r * l->n_out);
}

/* The values of `blocks` blocks' codes from block b, to wide [blocks][K][8] fp32 (fp32_tile_sums'
 * layout). */
static void fp8_widen(const avx2_qlinear_t *l, int64_t b, int64_t blocks, float *wide) {
    const uint8_t *codes = l->codes + b * l->k_in * 8;
    for (int64_t i = 0; i < blocks * l->k_in; i++) _mm256_storeu_ps(wide + i * 8, fp8_values(codes + i * 8));
}

typedef void dynamic_tile_fn(const avx2_qlinear_t *, int64_t, const void *, const float *, const float *,
                             float *);
#define DYNAMIC_TILE(NAME, BODY)                                                                    \
    static void NAME(const avx2_qlinear_t *l, int64_t b, const void *xq, const float *x_scale,    \
                     const float *wide, float *y) {                                               \
        (void)wide;                                                                                \
        BODY;                                                                                      \
    }
#define W8A8_TILE(BLOCKS, ROWS) \
    DYNAMIC_TILE(w8a8_tile_##BLOCKS##_##ROWS, w8a8_tile(l, b, xq, x_scale, y, BLOCKS, ROWS))
#define FP8_TILE(BLOCKS, ROWS) \
    DYNAMIC_TILE(fp8_tile_##BLOCKS##_##ROWS, fp8_tile(l, b, xq, x_scale, wide, y, BLOCKS, ROWS))
#define DYNAMIC_TILES(KIND, BLOCKS) KIND(BLOCKS, 1) KIND(BLOCKS, 2) KIND(BLOCKS, 3) KIND(BLOCKS, 4)
DYNAMIC_TILES(W8A8_TILE, 1)
DYNAMIC_TILES(W8A8_TILE, 2)
DYNAMIC_TILES(W8A8_TILE, 3)
DYNAMIC_TILES(FP8_TILE, 1)
DYNAMIC_TILES(FP8_TILE, 2)
DYNAMIC_TILES(FP8_TILE, 3)
/* [fp8][blocks - 1][rows - 1] */
static dynamic_tile_fn *const DYNAMIC_TILE_KERNELS[2][DYNAMIC_BLOCKS][DYNAMIC_ROWS] = {
    {{w8a8_tile_1_1, w8a8_tile_1_2, w8a8_tile_1_3, w8a8_tile_1_4},
     {w8a8_tile_2_1, w8a8_tile_2_2, w8a8_tile_2_3, w8a8_tile_2_4},
     {w8a8_tile_3_1, w8a8_tile_3_2, w8a8_tile_3_3, w8a8_tile_3_4}},
    {{fp8_tile_1_1, fp8_tile_1_2, fp8_tile_1_3, fp8_tile_1_4},
     {fp8_tile_2_1, fp8_tile_2_2, fp8_tile_2_3, fp8_tile_2_4},
     {fp8_tile_3_1, fp8_tile_3_2, fp8_tile_3_3, fp8_tile_3_4}},
};

/* y [rows, N] = the W8A8 or FP8 product of x [rows, K] (row stride x_stride) with the layer
 * (act_bits 8). Returns 0, or -1 when scratch memory (the quantized rows; FP8 over one row, each
 * thread's widened blocks) could not be allocated. */
int avx2_dynamic_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows, float *y) {
    const int64_t k_in = l->k_in, blocks = (l->n_out + 7) / 8, fp8 = l->fp8 != 0;
    const int64_t row_bytes = (int64_t)(fp8 ? sizeof(float) : sizeof(int16_t)) * k_in;
    const int64_t wide_floats = fp8 && rows > 1 ? DYNAMIC_BLOCKS * k_in * 8 : 0;
    char *xq = alloc_lines((size_t)(rows * row_bytes));
    float *x_scale = malloc(sizeof(float) * (size_t)rows);
    float *wide = wide_floats ? alloc_lines(sizeof(float) * (size_t)(omp_get_max_threads() * wide_floats)) : NULL;
    if (!xq || !x_scale || (wide_floats && !wide)) {
        free(xq);
        free(x_scale);
        free(wide);
        return -1;
    }
#pragma omp parallel
    {
        float *mine = wide ? wide + omp_get_thread_num() * wide_floats : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (fp8) quantize_row_fp8(x + r * x_stride, k_in, l->input_scale, (float *)(xq + r * row_bytes), x_scale + r);
            else quantize_row(x + r * x_stride, k_in, l->input_scale, (int16_t *)(xq + r * row_bytes), x_scale + r);
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b += DYNAMIC_BLOCKS) {
            const int64_t width = blocks - b < DYNAMIC_BLOCKS ? blocks - b : DYNAMIC_BLOCKS;
            dynamic_tile_fn *const *kernels = DYNAMIC_TILE_KERNELS[fp8][width - 1];
            if (mine) fp8_widen(l, b, width, mine);
            for (int64_t r = 0; r < rows; r += DYNAMIC_ROWS) {
                const int64_t tile = rows - r < DYNAMIC_ROWS ? rows - r : DYNAMIC_ROWS;
                kernels[tile - 1](l, b, xq + r * row_bytes, x_scale + r, mine, y + r * l->n_out);
            }
        }
    }
    free(xq);
    free(x_scale);
    free(wide);
    return 0;
}
#endif

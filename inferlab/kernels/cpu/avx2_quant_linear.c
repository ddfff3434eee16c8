/* Weight-only int8 and int4 linears (W8A16, W4A16), and dense fp32 ones, for fp32 activations on
 * AVX2 + FMA CPUs without AVX512-BF16 (quant_linear.c's kernels need it), e.g. AMD EPYC Zen 3.
 *
 * Why: a decode step is bound by reading the weights, and torch's weight-only kernels for fp32
 * (_weight_int8pack_mm, _weight_int4pack_mm_for_cpu) do not keep up with memory here: streaming
 * SmolLM2-135M's 30 layers of linears at one row on an AMD EPYC Zen 3 (2 cores) took 59.8 ms
 * (W8A16) and 112 ms (W4A16, groups of 64) against 34.6 ms for fp32 nn.Linear, and 518 and 964
 * against 68 at 8 rows. The codes must turn into fp32 products in a few instructions per 8
 * weights, and each code must be read once per call, not once per row.
 *
 * bits 32 runs dense fp32 weights (inferlab/kernels/avx2_fp32_linear.py) through tiles of their
 * own, 3 blocks (24 outputs) by 4 rows (fp32_tile): each broadcast input feeds 3 FMAs and each
 * weight vector 4. Tiles of one block by up to 8 rows, a load and 8 broadcasts per 8 FMAs, were
 * bound by issuing them: ~45-50 GFLOP/s a core from 16 rows on, the 3 x 4 tiles ~80 (about a
 * core's FMA peak).
 * oneDNN's fp32 matmul reads a decode step's weights at 12-17 GB/s here, the tiles at the
 * machine's read bandwidth. SmolLM2-135M's 30 layers' linears from DRAM, 2 cores, median of 7
 * rounds, CPU time (other jobs kept the 2 cores busy, so wall times measured the scheduler):
 * 14.6 ms against oneDNN's 23.8 at one row (1.63x; 17.7 with the old tiles), 24.6 / 56.9 at 8,
 * 105.8 / 157 at 64, 715 / 834 at 512 (the old tiles 1401); the table is avx2_fp32_linear.py's.
 *
 * dense_order int8 / int4 codes are dense fp32 weights held as the GGUF blocks they came from
 * (widened_linear, below): the embedded SmolLM2's 30 layers of Q4_1 linears at one row in 7.9-8.4
 * ms against 16.9 fp32-held (2.0x; 4.4-4.5 ms since prefetch_next), 1.5x at 2 and 4 rows, 1.2x at
 * 16, 1.05x at 64, the same bits.
 *
 * Layout (inferlab/kernels/avx2_blocks.py packs it): blocks of 8 outputs, one fp32 lane
 * each, so that a code vector widens straight into the 8 lanes an FMA adds to and no
 * horizontal sums are needed; the block's codes for 8 inputs sit in 64 bytes (int8: [8 inputs]
 * [8 outputs], one vpmovsxbd per input; fp32 likewise in 256 bytes, one load per input) or 32
 * bytes (int4: one 32-bit lane per output holding its 8 inputs' u = q + 8 as nibbles, input i at
 * bits 4i: masked in place, see int4_at). A block of 8 outputs is one contiguous stream of
 * K * 32, K * 8 or K * 4 bytes, read by one thread.
 * scale and offset fp32 [N/8][K/group][8]: w = u * scale + offset, offset = -(zero [+ 8]) * scale
 * (absent for symmetric weights: 0 or -8 * scale, so only the scales stream). int8: one FMA per 8
 * weights whatever the zero point, the dequantized vector then shared by all the rows of a tile.
 * int4: a group's sums of u * x, then sum * scale + offset * (the group's sum of x) once a group
 * (int4_rows prepares the rows): 1.00-1.28x the linears at one row, the same at 4 (two builds
 * alternating, 30 layers from memory, this VM's noise); a decode step of the embedded model went
 * from ~1.02x W8A16's time to 0.86x (benchmarks/quant_speed.py).
 *
 * Each block of codes takes its rows TILE_ROWS (4) at a time (int4: INT4_TILE_ROWS, 2), each
 * group of 3 fp32 blocks its rows 4 at a time, the weights read from memory for the first tile and
 * from L1/L2 for the next. A row of codes sums into CHAINS (2) accumulators (int4: INT4_CHAINS,
 * 4), alternate inputs, added at the end: one chain is bound by the FMA's latency at one row (2
 * cores, the layers below at one row: 12.1 ms W8A16 and 11.5 W4A16 with one chain and tiles of 8
 * rows, 9.0 and 8.0 with two), and four cost more at 16 rows (twice the tiles) than they gain at
 * one for int8. fp32 sums in one chain, inputs in
 * order (its 3 blocks give a row 3 chains). The order is the same whatever the tile holds, so a
 * row's output does not depend on the rows beside it (up to AVX2_KERNEL_MAX_ROWS and
 * AVX2_FP32_MAX_ROWS; past them, oneDNN's GEMM sums in its own order).
 *
 * More rows (past AVX2_KERNEL_MAX_ROWS, inferlab/quant/linear.py) dequantize the whole weight
 * (avx2_quant_dequantize) for oneDNN's fp32 GEMM: the weight lands in L2/L3 and is read back at
 * once, so the GEMM costs what dense fp32's does (0.93-0.97x its speed at 64 and 512 rows);
 * the kernel, whose rows each cost an FMA and a broadcast per 8 weights, was 0.94-0.99x at 64.
 *
 * Measured as above (2 cores, 30 distinct copies of the layers so that they come from DRAM,
 * median of 7 rounds; speed as a multiple of fp32 nn.Linear's):
 *
 *   | rows | fp32 ms | W8A16 ms     | W4A16 g64 ms | torch W8A16 | torch W4A16 |
 *   |------|---------|--------------|--------------|-------------|-------------|
 *   | 1    | 34.5    | 9.0 (3.8x)   | 8.0 (4.3x)   | 0.59x       | 0.29x       |
 *   | 4    | 72.6    | 13.7 (5.3x)  | 12.9 (5.6x)  | 0.30x       | 0.16x       |
 *   | 8    | 73.5    | 21.9 (3.4x)  | 21.7 (3.4x)  | 0.15x       | 0.08x       |
 *   | 16   | 89.9    | 40.6 (2.2x)  | 43.1 (2.1x)  | 0.60x       | 0.05x       |
 *   | 64   | 146     | 158 (0.93x)  | 157 (0.93x)  | 0.96x       | 0.02x       |
 *   | 512  | 733     | 757 (0.97x)  | 772 (0.95x)  | 0.86x       | 0.76x       |
 *
 * At one row W8A16 streams ~12 GB/s of codes and W4A16 ~7.5 (the table's code: a shift, a mask,
 * a conversion and two FMAs per 8 int4 weights, two chains): bound by the arithmetic and the
 * FMA's latency, not by memory; ~10-12.5 GB/s with int4_at and 4 chains.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* int8/int4 codes: accumulators a row (FMA latency bounds one chain at one row), and rows a
 * block takes at once: 8 accumulators (+ dequantizing) of 16 registers. */
#define CHAINS 2
#define TILE_ROWS 4
/* int4 (its codes now widen in two instructions): at one row, two chains of 4 FMAs a step each
 * bound it by the FMA's latency, so 4 chains, and tiles of 2 rows to keep the sums in registers */
#define INT4_CHAINS 4
#define INT4_TILE_ROWS 2
/* How far ahead (bytes, 16 steps) a block of int8 codes asks L1 for its stream: at one row the
 * hardware prefetcher left W8A16's 30 layers at 1.35x their time from cache. The linears at one
 * row, two builds alternating in one process (AMD EPYC Zen 3, 2 cores): 512 ahead 1.10-1.16x,
 * 1024 1.13-1.21x, 2048 1.14x; 4 and 16 rows 0.98-1.01x; int4 (bound by its arithmetic at one
 * row: as fast from cache as from memory) 1.01-1.02x, so it asks nothing. */
#define CODE_AHEAD 1024

/* Bytes of one block's codes for 8 inputs. */
static inline int64_t step_bytes(const int BITS) { return BITS * 8; }

/* Input i (0..7) of the 8-input step at `step`, for the block's 8 outputs: w = u * scale + offset
 * (fp32 weights as stored). */
static inline __attribute__((always_inline)) __m256 weights_at(const uint8_t *step, int i, __m256 scale,
                                                               __m256 offset, const int BITS) {
    __m256i u;
    if (BITS == 32 || BITS == 16) return dense_weights(step, 8 * i, BITS == 16);
    if (BITS == 8) {
        u = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(step + 8 * i)));
    } else {
        const __m256i lanes = _mm256_loadu_si256((const __m256i *)step);
        u = _mm256_and_si256(_mm256_srli_epi32(lanes, 4 * i), _mm256_set1_epi32(15));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), scale, offset);
}

/* int4: input i (0..7) of the 8-input step at `step` as u * 2^(4i) (u * 2^24 for i = 7), the
 * nibble masked in place, not shifted down: the rows it multiplies come scaled by 2^-4i
 * (int4_rows), exactly in fp32's normal range, so the products are u * x. An AND and a
 * conversion per 8 weights, against a shift, an AND, a conversion and the FMA of u * scale +
 * offset; the scale and the offset apply once a group (block_rows). */
static inline __attribute__((always_inline)) __m256 int4_at(const uint8_t *step, int i) {
    const __m256i lanes = _mm256_loadu_si256((const __m256i *)step);
    if (i == 7)  /* u * 2^28 would reach the sign bit */
        return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes, 4), _mm256_set1_epi32(15 << 24)));
    return _mm256_cvtepi32_ps(_mm256_and_si256(lanes, _mm256_set1_epi32(15 << (4 * i))));
}

/* Group `at`'s scale (unused for fp32 weights). */
static inline __attribute__((always_inline)) __m256 group_scale(const avx2_qlinear_t *l, int64_t at,
                                                                const int BITS) {
    return BITS >= 16 ? _mm256_setzero_ps() : _mm256_loadu_ps(l->scale + at * 8);
}

/* Group `at`'s offset (block-major, as the scales): stored with zero points; without, -8 * scale
 * for int4 (exact) and 0 for int8, so that symmetric weights stream no offsets. */
static inline __attribute__((always_inline)) __m256 group_offset(const avx2_qlinear_t *l, __m256 scale,
                                                                 int64_t at, const int BITS) {
    if (BITS >= 16) return _mm256_setzero_ps();
    if (l->offset) return _mm256_loadu_ps(l->offset + at * 8);
    return BITS == 8 ? _mm256_setzero_ps() : _mm256_mul_ps(scale, _mm256_set1_ps(-8.0f));
}

/* The first `count` (1..8) lanes of v (+ bias) to dst. */
static inline void store_outputs(float *dst, __m256 v, const float *bias, int64_t count) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    for (int64_t j = 0; j < count; j++) dst[j] = lanes[j] + (bias ? bias[j] : 0.0f);
}

/* y [ROWS, 8 outputs of block b] = x [ROWS, K] (row stride x_stride) @ the block's weights^T.
 * int8: each weight dequantized (u * scale + offset), then its products. int4: x holds
 * int4_rows' rows (scaled inputs, then each group's input sum); a group's sums of u * x start
 * afresh and end in the output's as sum * scale + offset * (the group's input sum). */
static inline __attribute__((always_inline)) void block_rows(const avx2_qlinear_t *l, int64_t b,
                                                             const float *x, int64_t x_stride,
                                                             float *y, const int BITS, const int ROWS) {
    const int64_t groups = l->k_in / l->group, steps = l->group / 8;
    const uint8_t *step = l->codes + b * (l->k_in / 8) * step_bytes(BITS);
    const int CH = BITS == 4 ? INT4_CHAINS : CHAINS;
    __m256 acc[TILE_ROWS][INT4_CHAINS], total[TILE_ROWS];
    for (int r = 0; r < ROWS; r++) {
        total[r] = _mm256_setzero_ps();
        for (int c = 0; c < CH; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < groups; g++) {
        const __m256 scale = group_scale(l, b * groups + g, BITS);
        const __m256 offset = group_offset(l, scale, b * groups + g, BITS);
        for (int64_t s = 0; s < steps; s++, step += step_bytes(BITS)) {
            const float *xk = x + (g * steps + s) * 8;
            if (BITS == 8) _mm_prefetch((const char *)step + CODE_AHEAD, _MM_HINT_T0);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256 w = BITS == 4 ? int4_at(step, i) : weights_at(step, i, scale, offset, BITS);
#pragma GCC unroll 8
                for (int r = 0; r < ROWS; r++)
                    acc[r][i % CH] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(xk + r * x_stride + i), acc[r][i % CH]);
            }
        }
        if (BITS == 4)
#pragma GCC unroll 4
            for (int r = 0; r < ROWS; r++) {
                const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
                total[r] = _mm256_fmadd_ps(sum, scale, total[r]);
                total[r] = _mm256_fmadd_ps(offset, _mm256_broadcast_ss(x + r * x_stride + l->k_in + g), total[r]);
                for (int c = 0; c < INT4_CHAINS; c++) acc[r][c] = _mm256_setzero_ps();
            }
    }
    const int64_t count = l->n_out - b * 8 < 8 ? l->n_out - b * 8 : 8;
    for (int r = 0; r < ROWS; r++) {
        __m256 sum = total[r];  /* int4: the groups' totals; int8: its chains added */
        if (BITS != 4) {
            sum = acc[r][0];
            for (int c = 1; c < CH; c++) sum = _mm256_add_ps(sum, acc[r][c]);
        }
        store_outputs(y + r * l->n_out + b * 8, sum, l->bias ? l->bias + b * 8 : NULL, count);
    }
}

/* The rows int4 tiles read, INT4_LANE_SCALE apart by input: x [rows, K] scaled by 2^-4i at input
 * i of each 8 (2^-24 at i = 7, see int4_at), then each group's sum of the unscaled inputs;
 * K + K / group floats a row. */
static const float INT4_LANE_SCALE[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 0x1p-24f};

static void int4_rows(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows, float *out) {
    const int64_t k_in = l->k_in, stride = k_in + k_in / l->group;
    const __m256 lane_scale = _mm256_loadu_ps(INT4_LANE_SCALE);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * stride;
        for (int64_t k = 0; k < k_in; k += 8) _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_loadu_ps(xr + k), lane_scale));
        for (int64_t g = 0; g < k_in / l->group; g++) {
            float sum = 0.0f;
            for (int64_t k = g * l->group; k < (g + 1) * l->group; k++) sum += xr[k];
            o[k_in + g] = sum;
        }
    }
}

/* (layer, first block, its weights widened or NULL, x, x_stride, y) */
typedef void tile_fn(const avx2_qlinear_t *, int64_t, const float *, const float *, int64_t, float *);
/* A tile_fn NAME that runs BODY, its row count and widths fixed at compile time. */
#define TILE_FN(NAME, BODY)                                                                       \
    static void NAME(const avx2_qlinear_t *l, int64_t b, const float *w, const float *x, int64_t x_stride, \
                     float *y) {                                                                  \
        (void)w;                                                                                  \
        BODY;                                                                                     \
    }
#define TILE(BITS, ROWS) TILE_FN(tile_##BITS##_##ROWS, block_rows(l, b, x, x_stride, y, BITS, ROWS))
TILE(8, 1) TILE(8, 2) TILE(8, 3) TILE(8, 4)
TILE(4, 1) TILE(4, 2)
/* [bits == 8][rows - 1]: the row count and code width fixed at compile time keep the
 * accumulators in registers and the loops unrolled (int4 up to INT4_TILE_ROWS). */
static tile_fn *const TILE_KERNELS[2][TILE_ROWS] = {
    {tile_4_1, tile_4_2, NULL, NULL},
    {tile_8_1, tile_8_2, tile_8_3, tile_8_4},
};

/* Outputs of blocks b.. b + BLOCKS - 1 for ROWS rows (+ bias) to y [ROWS, N]. */
static inline __attribute__((always_inline)) void store_tile(const avx2_qlinear_t *l, int64_t b,
                                                             __m256 acc[FP32_ROWS][FP32_BLOCKS], float *y,
                                                             const int BLOCKS, const int ROWS) {
#pragma GCC unroll 3
    for (int c = 0; c < BLOCKS; c++) {
        const int64_t first = (b + c) * 8, count = l->n_out - first < 8 ? l->n_out - first : 8;
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++)
            store_outputs(y + r * l->n_out + first, acc[r][c], l->bias ? l->bias + first : NULL, count);
    }
}

/* y [ROWS, the 8 * BLOCKS outputs from block b] = x [ROWS, K] @ their dense weights^T (bits 32,
 * or 16: bf16 bits widened as read; FP32_BLOCKS by FP32_ROWS tiles, see kernels.h), + bias; w
 * NULL: the layer's own, else the blocks' weights widened there (fp32, dense_order codes). */
static inline __attribute__((always_inline)) void fp32_tile(const avx2_qlinear_t *l, int64_t b, const float *w,
                                                            const float *x, int64_t x_stride,
                                                            float *y, const int BLOCKS, const int ROWS,
                                                            const int BF16) {
    __m256 acc[FP32_ROWS][FP32_BLOCKS];
    const void *weights = w ? (const void *)w : l->codes + b * l->k_in * 8 * (BF16 ? 2 : 4);
    fp32_tile_sums(weights, l->k_in, x, x_stride, acc, BLOCKS, ROWS, BF16);
    store_tile(l, b, acc, y, BLOCKS, ROWS);
}

#define FP32_TILE(W, BLOCKS, ROWS) \
    TILE_FN(fp32_tile_##W##_##BLOCKS##_##ROWS, fp32_tile(l, b, w, x, x_stride, y, BLOCKS, ROWS, W == 16))
#define FP32_TILES(W, BLOCKS) FP32_TILE(W, BLOCKS, 1) FP32_TILE(W, BLOCKS, 2) FP32_TILE(W, BLOCKS, 3) \
    FP32_TILE(W, BLOCKS, 4)
FP32_TILES(32, 1)
FP32_TILES(32, 2)
FP32_TILES(32, 3)
FP32_TILES(16, 1)
FP32_TILES(16, 2)
FP32_TILES(16, 3)
/* [bf16][blocks - 1][rows - 1]: fewer blocks for the last group of a layer (N/8 not a multiple
 * of 3), fewer rows for the last tile. */
static tile_fn *const FP32_TILE_KERNELS[2][FP32_BLOCKS][FP32_ROWS] = {
    {{fp32_tile_32_1_1, fp32_tile_32_1_2, fp32_tile_32_1_3, fp32_tile_32_1_4},
     {fp32_tile_32_2_1, fp32_tile_32_2_2, fp32_tile_32_2_3, fp32_tile_32_2_4},
     {fp32_tile_32_3_1, fp32_tile_32_3_2, fp32_tile_32_3_3, fp32_tile_32_3_4}},
    {{fp32_tile_16_1_1, fp32_tile_16_1_2, fp32_tile_16_1_3, fp32_tile_16_1_4},
     {fp32_tile_16_2_1, fp32_tile_16_2_2, fp32_tile_16_2_3, fp32_tile_16_2_4},
     {fp32_tile_16_3_1, fp32_tile_16_3_2, fp32_tile_16_3_3, fp32_tile_16_3_4}},
};

/* The tiles for `width` blocks (dense: FP32_BLOCKS or the last blocks of a layer) of `bits`. */
static inline tile_fn *const *tiles_for(int64_t bits, int64_t width) {
    return bits >= 16 ? FP32_TILE_KERNELS[bits == 16][width - 1] : TILE_KERNELS[bits == 8];
}

/* dense_order codes: a layer whose fp32 weights are the values of int8 or int4 codes (a GGUF's
 * Q8_0 and Q4_1 blocks: d * q (+ m), the product exact), held as those codes (0.28x and 0.19x
 * the fp32 bytes, fp32 scales included) and summed in the dense tiles' order: each output one
 * chain over k in order of the products weights_at's values make, so that the outputs are the
 * fp32 layer's bits. One row decodes the codes as it reads them; more widen each group of
 * FP32_BLOCKS blocks once, to the thread's scratch, for the dense tiles of all the rows. */

/* One row: while a group of BLOCKS blocks is read, the next group asks L1 for its codes, a step's
 * share at each step, and for its scales and offsets, two groups' at a time. The hardware
 * prefetcher left the one-row call at ~1.6x its time from cache: the embedded model's 30 layers
 * of Q4_1 linears at one row, builds alternating in one process (AMD EPYC Zen 3, 2 cores, from
 * memory), 6.6-6.8 -> 4.4-4.5 ms (from cache 4.0 -> 4.1), Q8_0 7.5-8.5 -> 6.5-7.1; asking L2
 * or two groups ahead did the same, and 4 or 6 blocks a call (more chains) were slower. */
static inline __attribute__((always_inline)) void prefetch_next(const avx2_qlinear_t *l, int64_t b, int64_t g,
                                                               int64_t s, const int BITS, const int BLOCKS) {
    const int64_t groups = l->k_in / l->group, steps = l->group / 8, next = b + BLOCKS;
    if (next * 8 >= l->n_out) return;
    const int64_t share = BLOCKS * step_bytes(BITS);  /* a step's share of the next group's codes */
    const char *codes = (const char *)(l->codes + next * (l->k_in / 8) * step_bytes(BITS)) + (g * steps + s) * share;
    for (int64_t at = 0; at < share; at += 64) _mm_prefetch(codes + at, _MM_HINT_T0);
    if (s != 0 || g % 2 != 0) return;
    const int64_t first = (next * groups + g * BLOCKS) * 8;  /* two groups' share of their scales */
    for (int64_t at = 0; at < 16 * BLOCKS; at += 16) {
        _mm_prefetch((const char *)(l->scale + first + at), _MM_HINT_T0);
        if (l->offset) _mm_prefetch((const char *)(l->offset + first + at), _MM_HINT_T0);
    }
}

/* y [1, the 8 * BLOCKS outputs from block b] = x [1, K] @ the blocks' weights^T, + bias. */
static inline __attribute__((always_inline)) void widened_row(const avx2_qlinear_t *l, int64_t b, const float *x,
                                                              float *y, const int BITS, const int BLOCKS) {
    const int64_t groups = l->k_in / l->group, steps = l->group / 8;
    const int64_t stride = l->k_in / 8 * step_bytes(BITS);  /* a block's codes */
    const uint8_t *step = l->codes + b * stride;
    __m256 acc[FP32_ROWS][FP32_BLOCKS];
#pragma GCC unroll 3
    for (int c = 0; c < BLOCKS; c++) acc[0][c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256 scale[FP32_BLOCKS], offset[FP32_BLOCKS];
#pragma GCC unroll 3
        for (int c = 0; c < BLOCKS; c++) {
            scale[c] = group_scale(l, (b + c) * groups + g, BITS);
            offset[c] = group_offset(l, scale[c], (b + c) * groups + g, BITS);
        }
        for (int64_t s = 0; s < steps; s++, step += step_bytes(BITS)) {
            const float *xk = x + (g * steps + s) * 8;
            prefetch_next(l, b, g, s, BITS, BLOCKS);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256 xi = _mm256_broadcast_ss(xk + i);
#pragma GCC unroll 3
                for (int c = 0; c < BLOCKS; c++)
                    acc[0][c] = _mm256_fmadd_ps(weights_at(step + c * stride, i, scale[c], offset[c], BITS), xi,
                                                acc[0][c]);
            }
        }
    }
    store_tile(l, b, acc, y, BLOCKS, 1);
}

/* Blocks b .. b + blocks - 1 widened to wide [blocks][K][8] fp32 (fp32_tile_sums' layout). */
static inline __attribute__((always_inline)) void widen_blocks(const avx2_qlinear_t *l, int64_t b, int64_t blocks,
                                                               float *wide, const int BITS) {
    const int64_t groups = l->k_in / l->group, steps = l->group / 8;
    const uint8_t *step = l->codes + b * (l->k_in / 8) * step_bytes(BITS);
    for (int64_t g = b * groups; g < (b + blocks) * groups; g++) {  /* a block's groups, then the next's */
        const __m256 scale = group_scale(l, g, BITS), offset = group_offset(l, scale, g, BITS);
        for (int64_t s = 0; s < steps; s++, step += step_bytes(BITS), wide += 64)
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(wide + i * 8, weights_at(step, i, scale, offset, BITS));
    }
}

#define WIDENED_ROW(BITS, BLOCKS) \
    TILE_FN(widened_row_##BITS##_##BLOCKS, widened_row(l, b, x, y, BITS, BLOCKS); (void)x_stride)
WIDENED_ROW(8, 1) WIDENED_ROW(8, 2) WIDENED_ROW(8, 3)
WIDENED_ROW(4, 1) WIDENED_ROW(4, 2) WIDENED_ROW(4, 3)
/* [bits == 8][blocks - 1] */
static tile_fn *const WIDENED_ROW_KERNELS[2][FP32_BLOCKS] = {
    {widened_row_4_1, widened_row_4_2, widened_row_4_3},
    {widened_row_8_1, widened_row_8_2, widened_row_8_3},
};

/* avx2_quant_linear for dense_order codes; -1 when the scratch could not be allocated. */
static int widened_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows, float *y) {
    const int64_t blocks = (l->n_out + 7) / 8, wide_floats = rows > 1 ? FP32_BLOCKS * l->k_in * 8 : 0;
    const int int8 = l->bits == 8;
    float *wide = wide_floats ? alloc_lines(sizeof(float) * (size_t)(omp_get_max_threads() * wide_floats)) : NULL;
    if (wide_floats && !wide) return -1;
#pragma omp parallel
    {
        float *mine = wide ? wide + omp_get_thread_num() * wide_floats : NULL;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b += FP32_BLOCKS) {
            const int64_t width = blocks - b < FP32_BLOCKS ? blocks - b : FP32_BLOCKS;
            if (!mine) {
                WIDENED_ROW_KERNELS[int8][width - 1](l, b, NULL, x, x_stride, y);
                continue;
            }
            if (int8) widen_blocks(l, b, width, mine, 8);
            else widen_blocks(l, b, width, mine, 4);
            tile_fn *const *kernels = FP32_TILE_KERNELS[0][width - 1];
            for (int64_t r = 0; r < rows; r += FP32_ROWS) {
                const int64_t tile = rows - r < FP32_ROWS ? rows - r : FP32_ROWS;
                kernels[tile - 1](l, b, mine, x + r * x_stride, x_stride, y + r * l->n_out);
            }
        }
    }
    free(wide);
    return 0;
}

/* y [rows, N] = x [rows, K] (row stride x_stride) @ W^T (+ bias). A thread takes `width`
 * blocks at a time (fp32: FP32_BLOCKS, codes: 1), and each group its rows a tile at a time, the weights
 * read from memory for the first tile and from L1/L2 for the next. W8A8 and FP8 layers go to
 * avx2_dynamic_linear.c. Returns 0, or -1 when scratch memory (int4_rows', W8A8's and FP8's) could not be allocated. */
int avx2_quant_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows,
                      float *y) {
    if (l->act_bits == 8) return avx2_dynamic_linear(l, x, x_stride, rows, y);
    if (l->dense_order && l->bits <= 8) return widened_linear(l, x, x_stride, rows, y);
    const int64_t blocks = (l->n_out + 7) / 8;
    const int64_t width = l->bits >= 16 ? FP32_BLOCKS : 1;
    const int64_t most = l->bits >= 16 ? FP32_ROWS : l->bits == 4 ? INT4_TILE_ROWS : TILE_ROWS;
    const int64_t tile_stride = l->bits == 4 ? l->k_in + l->k_in / l->group : x_stride;
    float *scaled = l->bits == 4 ? alloc_lines(sizeof(float) * (size_t)(rows * tile_stride)) : NULL;
    if (l->bits == 4 && !scaled) return -1;
    const float *tile_rows = scaled ? scaled : x;
#pragma omp parallel
    {
        if (scaled) int4_rows(l, x, x_stride, rows, scaled);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b += width) {
            tile_fn *const *kernels = tiles_for(l->bits, blocks - b < width ? blocks - b : width);
            for (int64_t r = 0; r < rows; r += most) {
                const int64_t tile = rows - r < most ? rows - r : most;
                kernels[tile - 1](l, b, NULL, tile_rows + r * tile_stride, tile_stride, y + r * l->n_out);
            }
        }
    }
    free(scaled);
    return 0;
}

/* w[8 vectors: input i, 8 outputs] -> t[8 vectors: output j, 8 inputs]. */
static inline void transpose8(const __m256 w[8], __m256 t[8]) {
    __m256 lo[4], hi[4], q[8];
    for (int p = 0; p < 4; p++) {
        lo[p] = _mm256_unpacklo_ps(w[2 * p], w[2 * p + 1]);
        hi[p] = _mm256_unpackhi_ps(w[2 * p], w[2 * p + 1]);
    }
    for (int p = 0; p < 2; p++) {
        q[4 * p + 0] = _mm256_shuffle_ps(lo[2 * p], lo[2 * p + 1], 0x44);
        q[4 * p + 1] = _mm256_shuffle_ps(lo[2 * p], lo[2 * p + 1], 0xee);
        q[4 * p + 2] = _mm256_shuffle_ps(hi[2 * p], hi[2 * p + 1], 0x44);
        q[4 * p + 3] = _mm256_shuffle_ps(hi[2 * p], hi[2 * p + 1], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm256_permute2f128_ps(q[j], q[4 + j], 0x20);
        t[4 + j] = _mm256_permute2f128_ps(q[j], q[4 + j], 0x31);
    }
}

/* Outputs first .. first + count - 1 of block b (count <= 8 - first): their weights into rows
 * [count, K] (row stride k_in). */
static inline __attribute__((always_inline)) void dequantize_lanes(const avx2_qlinear_t *l, int64_t b,
                                                                   int64_t first, int64_t count,
                                                                   float *rows, const int BITS) {
    const int64_t groups = l->k_in / l->group, steps = l->group / 8;
    const uint8_t *step = l->codes + b * (l->k_in / 8) * step_bytes(BITS);
    for (int64_t g = 0; g < groups; g++) {
        const __m256 scale = group_scale(l, b * groups + g, BITS);
        const __m256 offset = group_offset(l, scale, b * groups + g, BITS);
        for (int64_t s = 0; s < steps; s++, step += step_bytes(BITS)) {
            __m256 inputs[8], outputs[8];
            for (int i = 0; i < 8; i++) inputs[i] = weights_at(step, i, scale, offset, BITS);
            transpose8(inputs, outputs);
            for (int64_t j = 0; j < count; j++)
                _mm256_storeu_ps(rows + j * l->k_in + (g * steps + s) * 8, outputs[first + j]);
        }
    }
}

static void dequantize_any(const avx2_qlinear_t *l, int64_t b, int64_t first, int64_t count, float *rows) {
    if (l->bits == 32) dequantize_lanes(l, b, first, count, rows, 32);
    else if (l->bits == 16) dequantize_lanes(l, b, first, count, rows, 16);
    else if (l->bits == 8) dequantize_lanes(l, b, first, count, rows, 8);
    else dequantize_lanes(l, b, first, count, rows, 4);
}

/* w [N, K] fp32 = the layer's weights, for a GEMM on many rows (and for inspection). */
void avx2_quant_dequantize(const avx2_qlinear_t *l, float *w) {
    const int64_t blocks = (l->n_out + 7) / 8;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        dequantize_any(l, b, 0, l->n_out - b * 8 < 8 ? l->n_out - b * 8 : 8, w + b * 8 * l->k_in);
}

/* out [count, K] = the weight's rows ids[0 .. count) (each in 0 .. n_out - 1, which the caller
 * checks): a tied embedding read from its head's codes. A row decodes its block's 8 outputs and
 * keeps one: 0.6 us a row of 576 (512 rows in 0.32 ms through PackedEmbedding, AMD EPYC Zen 3). */
void avx2_quant_rows(const avx2_qlinear_t *l, const int64_t *ids, int64_t count, float *out) {
    for (int64_t m = 0; m < count; m++) dequantize_any(l, ids[m] / 8, ids[m] % 8, 1, out + m * l->k_in);
}

int has_avx2_quant_linear(void) { return 1; }
#else
int has_avx2_quant_linear(void) { return 0; } /* callers keep torch's weight-only kernels */
#endif

/* Weight-only int8 and int4 linears (W8A16, W4A16) for bf16 activations, AVX512-BF16 and -VNNI.
 *
 * Why: a decode step is bound by reading the weights; int8 halves and int4 quarters the bytes,
 * but only if the kernel turns codes into products faster than memory delivers them, in few
 * instructions per 64 bytes. So decode rows multiply in integers with vpdpbusd, on layouts a
 * 64-byte load turns into its unsigned operand, quads of 16 outputs x 4 inputs:
 *
 *   int8 [N/16][K/4][16][4]: u = q + 128, one quad per line, as loaded.
 *   int4 [N/16][K/8][64] bytes: u = q + 8, byte 4j + i holding output j's inputs i (low
 *        nibble) and 4 + i (high nibble): a mask and a shift give a line's two quads.
 *   In both, the blocks of a pair (2p, 2p + 1), which a task reads together, alternate line by
 *   line ([K/4 or K/8][2][64] a pair; an odd last block alone), so that a task reads one
 *   stream: on an Intel Xeon, the model's int4 linears read 13-15% faster than from two
 *   streams 4.6-12 KB apart; on an AMD EPYC (Zen 5), its int8 linears at one row took 1.10-1.11x
 *   (slow memory, ~50 GB/s) and 1.19-1.25x (fast, ~70 GB/s) of a plain read of their bytes,
 *   against 1.25-1.27x and 1.36x from two streams (benchmarks/linear_floor.py).
 *   (inferlab/quant/formats/vnni.py packs both.)
 *   group_scale bf16 [N/16][K/group][16], a block's groups one after another (block_groups);
 *   group_zero (zero points, bf16, same shape) or NULL; bias bf16 [N] or NULL. A task thus reads
 *   each block's scales in order; as [K/group][N], each group's came from another row, N values
 *   apart (AMD EPYC Zen 4, the model's W4A16 linears in groups of 64 at one row: 1.21-1.30x of a
 *   plain read of their codes, then 1.16-1.18x). Scales in bf16, the compute dtype, as vLLM's
 *   weight-only kernels take them: a bf16 checkpoint's scales pass unchanged, and int4 in groups
 *   of 64 streams 3% fewer bytes than with fp32 scales (5% faster linears at one row).
 *
 * The activations of a decode batch (up to KERNEL_MAX_ROWS rows) are quantized first: 14-bit
 * codes xq with one power-of-two scale per block of up to 64 inputs, 2^(e - 13) for e the
 * exponent of the block's largest |x|, split as 128 hi + lo into two bytes, each multiplied
 * against u. A bf16 value at most 2^6 times smaller than its block's largest keeps all its bits;
 * a smaller one rounds to a multiple of the scale, off by at most 2^-14 of the block's largest.
 * Per activation block the integer sum of q * xq is exact (the offset comes off in integers);
 * per group, y += scale * (sum - zero * sum(xq)). Before, the codes were widened to bf16 for
 * vdpbf16ps: six instructions per int8 k-pair (W8A16 streamed ~18 GB/s) and eleven per int4
 * line at one row (~14 GB/s).
 *
 * Then each task of two output blocks takes its rows TILE_ROWS (4) at a time, the weights read
 * from memory for the first rows only; from 13 rows, on a CPU with AMX, quant_tiles.c takes
 * them with the same bits. A row's output thus does not depend on how many rows came with it,
 * and a decode batch reads the compressed weights: the model's linears at 16 rows took 14.0
 * (W8A16) and 10.8 ms (W4A16) dequantized as below, against 6.6 and 7.4 ms (bf16: 7.8).
 *
 * More rows (a prompt's) dequantize the weight into matmul.c's bf16 layout and take the bf16
 * GEMM, which a prefill is bound by the arithmetic of (widened_gemm: on AMX a chunk at a time
 * into each thread's L2, else the whole weight once per call). Chunked, and with the codes
 * prefetched, a 512-token prefill took 71-72 ms (W8A16) and 68 (W4A16) against 77.5 and 75
 * with the whole weight dequantized first (bf16: 67-68).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "quant_linear.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define TASK_BLOCKS 2 /* 16-output blocks a task, see register_kernel */
#define STACK_K 4096 /* inputs whose activations quantize onto the stack, see quant_kernel */
#define KERNEL_MAX_ROWS 64 /* more rows: the weight dequantized, then the bf16 GEMM */
/* Lines ahead that block_sums asks for into L1 and, where L2_AHEAD is not 0, into L2: memory
 * time and arithmetic then overlap better on two of the three CPUs measured, whose L1 alone does
 * not keep enough lines in flight (benchmarks/linear_floor.py, the model's linears at one row,
 * settings interleaved in one process, their order rotated: the first after a flush ran ~5%
 * slower). The Intel Xeon (AMX), W4A16 with 96 into L2: 2.48-2.52 -> 2.21-2.26 ms (64 to 160
 * alike); W8A16 4.36-4.45 -> 4.11-4.23 ms with it (1.20-1.23x -> 1.13-1.17x of a plain read of
 * the codes; an earlier month's run had found no gain), and 48 into L1 cost W4A16 2-4%. The AMD
 * EPYC Zen 4 (512-bit VNNI on 256-bit units, no AMX, no AVX-VNNI), W8A16: 1.10-1.13x of the read
 * with 32 ahead into L1 alone, 1.09x adding 160 into L2, 1.05-1.07x with 48 and 160 (W4A16
 * 1.16-1.19x with any of the three). On the Zen 5, the one with AVX-VNNI and no AMX, the L2 ask
 * cost (W4A16: 1.18x of the read without it, 1.26-1.27x with). */
#if defined(__AMX_TILE__)
#define L1_AHEAD 32
#define L2_AHEAD 96
#elif !defined(__AVXVNNI__)
#define L1_AHEAD 48
#define L2_AHEAD 160
#else
#define L1_AHEAD 32
#define L2_AHEAD 0 /* no ask into L2 */
#endif

/* A quad of unsigned bytes (16 outputs x 4 inputs) -> its two input pairs as 16-bit words in
 * the VNNI pair layout (word 2j + t: output j, input t), zero-extended: within each 32-bit
 * lane, bytes 0 and 1, then 2 and 3 (0x80 in a shuffle index selects a zero). */
static inline __attribute__((always_inline)) void quad_pairs(__m512i quad, __m512i pairs[2]) {
    const __m512i lane = _mm512_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
                                         12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
                                         12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
                                         12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
    pairs[0] = _mm512_shuffle_epi8(quad, _mm512_or_si512(_mm512_set1_epi32((int)0x80018000u), lane));
    pairs[1] = _mm512_shuffle_epi8(quad, _mm512_or_si512(_mm512_set1_epi32((int)0x80038002u), lane));
}

/* One 64-byte line of a 16-output block -> its k-pairs as bf16 VNNI vectors v: int8, two
 * pairs of u = q + 128 (integers below 256: exact in bf16, through fp32); int4, four pairs of
 * 128 + u (the bf16 word 0x43XY is 128 + u). */
static inline __attribute__((always_inline)) void decode_line(const uint8_t *src, const int BITS,
                                                              __m512bh v[4]) {
    __m512i quads[2], words[2];
    if (BITS == 8) {
        quad_pairs(_mm512_loadu_si512(src), words);
        for (int p = 0; p < 2; p++) {
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(words[p])));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(words[p], 1)));
            v[p] = _mm512_cvtne2ps_pbh(hi, lo);
        }
        return;
    }
    int4_quads(src, quads);
    for (int q = 0; q < 2; q++) {
        quad_pairs(quads[q], words);
        for (int p = 0; p < 2; p++)
            v[2 * q + p] = (__m512bh)_mm512_or_si512(words[p], _mm512_set1_epi16(0x4300));
    }
}

/* A row of bf16 x [K] -> 14-bit integer codes xq, split as xq = 128 hi + lo (hi signed, lo in
 * [0, 128)) into xhi, xlo [K], with one power-of-two scale 2^(e - 13) per block (e the exponent
 * of the block's largest |x|) and each block's sum of codes: xscale, xsum [K / block].
 * Multiplying by a power of two is exact, so a code rounds only for a value more than 2^6 times
 * smaller than its block's largest. The largest comes from the bits, as dynamic_linear.c's
 * row_absmax takes it, so that a NaN or an inf shows there: its block gets a NaN scale, and its
 * row's outputs come out NaN rather than finite and wrong. */
static void quantize_row(const uint16_t *x, int64_t k, int64_t block, int8_t *xhi, int8_t *xlo,
                         float *xscale, int32_t *xsum) {
    const __m256i magnitude = _mm256_set1_epi16(0x7fff);
    const __mmask16 lanes = block < 16 ? (__mmask16)((1u << block) - 1) : 0xFFFF;
    for (int64_t b = 0; b < k / block; b++) {
        const uint16_t *src = x + b * block;
        __m256i top = _mm256_setzero_si256();
        for (int64_t i = 0; i < block; i += 16)
            top = _mm256_max_epu16(top, _mm256_and_si256(_mm256_maskz_loadu_epi16(lanes, src + i), magnitude));
        const float largest = bf16_to_f32((uint16_t)_mm512_reduce_max_epu32(_mm512_cvtepu16_epi32(top)));
        int e = largest > 0.0f ? ilogbf(largest) : 0;
        e = e < -100 ? -100 : e;  /* the scale's inverse stays finite */
        __m512 up = _mm512_set1_ps(ldexpf(1.0f, 13 - e));
        __m512i codes = _mm512_setzero_si512();
        for (int64_t i = 0; i < block; i += 16) {
            __m512 v = bf16x16_widen(_mm256_maskz_loadu_epi16(lanes, src + i));
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, up));
            codes = _mm512_add_epi32(codes, q);
            _mm_mask_storeu_epi8(xhi + b * block + i, lanes, _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 7)));
            _mm_mask_storeu_epi8(xlo + b * block + i, lanes, _mm512_cvtepi32_epi8(
                _mm512_and_si512(q, _mm512_set1_epi32(127))));
        }
        xscale[b] = isfinite(largest) ? ldexpf(1.0f, e - 13) : NAN;
        xsum[b] = _mm512_reduce_add_epi32(codes);
    }
}

/* quantize_row for each row of x (row stride x_stride) into xhi, xlo [rows][K] and xscale, xsum
 * [rows][K / block]; a decode batch's few rows without a parallel region, which costs more than
 * they do. */
static void quantize_activations(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k,
                                 int64_t block, int8_t *xhi, int8_t *xlo, float *xscale,
                                 int32_t *xsum) {
    const int64_t per_row = k / block;
    if (rows <= TILE_ROWS) {
        for (int64_t m = 0; m < rows; m++)
            quantize_row(x + m * x_stride, k, block, xhi + m * k, xlo + m * k, xscale + m * per_row,
                         xsum + m * per_row);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < rows; m++)
        quantize_row(x + m * x_stride, k, block, xhi + m * k, xlo + m * k, xscale + m * per_row,
                     xsum + m * per_row);
}

/* Rows r0 .. of x's activations, as a kernel for up to TILE_ROWS rows takes them. */
static inline act_t act_rows(const act_t *x, int64_t k, int64_t r0) {
    const int64_t per_row = k / x->block;
    return (act_t){x->hi + r0 * k, x->lo + r0 * k, x->scale + r0 * per_row, x->sum + r0 * per_row, x->block};
}

/* The int32 sums of q * xq over activation block a for a task's 16-output blocks, from the
 * unsigned codes u = q + offset (int8: one quad per 64-byte line; int4: two): vpdpbusd
 * multiplies u by each half of xq = 128 hi + lo, and offset * sum(xq) comes off in integers, so
 * nothing cancels in floating point. At most 16 quads of 255 * 2^7 * 4 per half: below 2^29 in
 * all. */
static inline __attribute__((always_inline)) void block_sums(
        const lines_t w[2], const int BITS, const act_t *x, int64_t k, int64_t a,
        const int ROWS, __m512i sums[2][TILE_ROWS]) {
    const int quads_per_line = BITS == 8 ? 1 : 2;
    const int64_t act_blocks = k / x->block, lines = x->block / (4 * quads_per_line);
    __v16si hi[2][TILE_ROWS], lo[2][TILE_ROWS];  /* see vnni_gemm.c's int8_tile_sums: not __m512i */
    for (int b = 0; b < TASK_BLOCKS; b++)
        for (int m = 0; m < ROWS; m++) hi[b][m] = lo[b][m] = (__v16si)_mm512_setzero_si512();
    for (int64_t line = a * lines; line < (a + 1) * lines; line++) {
        __m512i quads[2][2];
        for (int b = 0; b < TASK_BLOCKS; b++) {
            const uint8_t *src = w[b].start + line * w[b].stride;
            /* a pair's stream runs on into the next pair by itself */
            _mm_prefetch((const char *)src + L1_AHEAD * w[b].stride, _MM_HINT_T0);
            if (L2_AHEAD) _mm_prefetch((const char *)src + L2_AHEAD * w[b].stride, _MM_HINT_T1);
            if (BITS == 8) quads[b][0] = _mm512_loadu_si512(src);
            else int4_quads(src, quads[b]);
        }
        for (int m = 0; m < ROWS; m++)
            for (int q = 0; q < quads_per_line; q++) {
                const int64_t at = m * k + (line * quads_per_line + q) * 4;
                int32_t high, low;
                memcpy(&high, x->hi + at, 4);
                memcpy(&low, x->lo + at, 4);
                __m512i hv = _mm512_set1_epi32(high), lv = _mm512_set1_epi32(low);
                for (int b = 0; b < TASK_BLOCKS; b++) {
                    hi[b][m] = (__v16si)_mm512_dpbusd_epi32((__m512i)hi[b][m], quads[b][q], hv);
                    lo[b][m] = (__v16si)_mm512_dpbusd_epi32((__m512i)lo[b][m], quads[b][q], lv);
                }
            }
    }
    for (int m = 0; m < ROWS; m++) {
        __m512i offset = _mm512_set1_epi32((BITS == 8 ? 128 : 8) * x->sum[m * act_blocks + a]);
        for (int b = 0; b < TASK_BLOCKS; b++)
            sums[b][m] = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32((__m512i)hi[b][m], 7), (__m512i)lo[b][m]),
                                          offset);
    }
}

/* The TASK_BLOCKS 16-output blocks from b0 (an odd last block is read twice and written once)
 * for ROWS <= TILE_ROWS rows; BITS and ROWS are constants so the sums stay in registers. Each
 * activation block's integer sums are scaled into the group's fp32 sum; then y += scale * (sum -
 * zero * sum(xq over the group)). */
static inline __attribute__((always_inline)) void quant_blocks(
        const linear_t *l, const int BITS, const act_t *x, const int ROWS, uint16_t *y,
        int64_t b0) {
    const int64_t n = l->n_out, k = l->k_in, blocks = n / 16, act_blocks = k / x->block;
    const int nb = blocks - b0 < TASK_BLOCKS ? 1 : TASK_BLOCKS;
    const lines_t w[2] = {block_lines(l, BITS, b0), block_lines(l, BITS, b0 + nb - 1)};
    __m512 out[2][TILE_ROWS];
    for (int b = 0; b < TASK_BLOCKS; b++)
        for (int m = 0; m < ROWS; m++) out[b][m] = _mm512_setzero_ps();
    const int64_t next_blocks = blocks - b0 - TASK_BLOCKS;  /* the next task's, if any */
    const int64_t next_values = (next_blocks < TASK_BLOCKS ? next_blocks : TASK_BLOCKS) * (k / l->group) * 16;
    for (int64_t g = 0; g < k / l->group; g++) {
        __m512 sum[2][TILE_ROWS];
        float group_xsum[TILE_ROWS] = {0};
        /* The next task's scales (and zero points), a line a group: a task ahead, not a group,
         * as a group's lines take less time than memory's latency. */
        if (g * 32 < next_values) {
            _mm_prefetch((const char *)(block_groups(l->group_scale, l, b0 + TASK_BLOCKS) + g * 32), _MM_HINT_T0);
            if (l->group_zero)
                _mm_prefetch((const char *)(block_groups(l->group_zero, l, b0 + TASK_BLOCKS) + g * 32), _MM_HINT_T0);
        }
        for (int b = 0; b < TASK_BLOCKS; b++)
            for (int m = 0; m < ROWS; m++) sum[b][m] = _mm512_setzero_ps();
        for (int64_t a = g * (l->group / x->block); a < (g + 1) * (l->group / x->block); a++) {
            __m512i sums[2][TILE_ROWS];
            block_sums(w, BITS, x, k, a, ROWS, sums);
            for (int m = 0; m < ROWS; m++) {
                const float step = x->scale[m * act_blocks + a];
                group_xsum[m] = fmaf((float)x->sum[m * act_blocks + a], step, group_xsum[m]);
                for (int b = 0; b < TASK_BLOCKS; b++)
                    sum[b][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[b][m]), _mm512_set1_ps(step),
                                                sum[b][m]);
            }
        }
        for (int b = 0; b < TASK_BLOCKS; b++) {
            const int64_t block = b0 + (b < nb ? b : 0);
            __m512 scale = bf16x16_to_f32(block_groups(l->group_scale, l, block) + g * 16);
            for (int m = 0; m < ROWS; m++) {
                __m512 s = sum[b][m];
                if (l->group_zero)
                    s = _mm512_fnmadd_ps(bf16x16_to_f32(block_groups(l->group_zero, l, block) + g * 16),
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

/* The register kernel over rows of quantized activations, TILE_ROWS rows at a time. The switch
 * sits inside the parallel loop so that every case inlines its kernel with constant BITS and
 * ROWS: a constant passed into the loop from outside reaches OpenMP's outlined body as a
 * variable. Two blocks a task, which share each broadcast of the activations and read one
 * stream (their lines alternate). */
static void register_kernel(const linear_t *l, const act_t *act, int64_t rows, uint16_t *y) {
#pragma omp parallel for schedule(static)
    for (int64_t b0 = 0; b0 < l->n_out / 16; b0 += TASK_BLOCKS)
        for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
            const act_t group = act_rows(act, l->k_in, r0);
            uint16_t *yr = y + r0 * l->n_out;
            switch ((int)(rows - r0 < TILE_ROWS ? rows - r0 : TILE_ROWS) + (l->kind == LINEAR_INT8 ? 0 : TILE_ROWS)) {
            case 1: quant_blocks(l, 8, &group, 1, yr, b0); break;
            case 2: quant_blocks(l, 8, &group, 2, yr, b0); break;
            case 3: quant_blocks(l, 8, &group, 3, yr, b0); break;
            case 4: quant_blocks(l, 8, &group, 4, yr, b0); break;
            case 5: quant_blocks(l, 4, &group, 1, yr, b0); break;
            case 6: quant_blocks(l, 4, &group, 2, yr, b0); break;
            case 7: quant_blocks(l, 4, &group, 3, yr, b0); break;
            default: quant_blocks(l, 4, &group, 4, yr, b0); break;
            }
        }
}

/* Up to KERNEL_MAX_ROWS rows, reading the weights once: the activations quantized, then the
 * register kernel (or quant_tiles.c's). Up to TILE_ROWS rows of up to STACK_K inputs quantize
 * onto the stack: malloc and free took ~0.2 us of a call that streams a 576 x 576 int4 weight
 * in ~2 us from the caches, a decode step makes 120 such calls. Returns 0, or -2 when out of
 * memory. */
static int quant_kernel(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                        uint16_t *y) {
    const int64_t k = l->k_in, block = act_block(l), act_blocks = k / block;
    const int tiles = quant_tiles_fit(l, rows);
    const int64_t padded = tiles ? round_up(rows, 16) : rows;  /* a tile loads 16 rows */
    int8_t stack_codes[2 * TILE_ROWS * STACK_K] __attribute__((aligned(64)));
    float stack_steps[2 * TILE_ROWS * (STACK_K / 8)];  /* scales and sums; blocks of >= 8 inputs */
    const int on_stack = padded <= TILE_ROWS && k <= STACK_K && block >= 8;
    int8_t *xhi = on_stack ? stack_codes : alloc_lines((size_t)(2 * padded * k));
    float *xscale = on_stack ? stack_steps
                             : calloc((size_t)(padded * act_blocks), sizeof(float) + sizeof(int32_t));
    int status = xhi && xscale ? 0 : -2;
    if (!status) {
        int32_t *xsum = (int32_t *)(xscale + padded * act_blocks);
        quantize_activations(x, x_stride, rows, k, block, xhi, xhi + padded * k, xscale, xsum);
        const act_t act = {xhi, xhi + padded * k, xscale, xsum, block};
        if (tiles) status = quant_tiles(l, &act, rows, y);
        else register_kernel(l, &act, rows, y);
    }
    if (!on_stack) {
        free(xhi);
        free(xscale);
    }
    return status;
}

/* The weight as bf16 in matmul.c's layout [N/16][K/2][16][2]: (v - offset - zero) * scale from
 * decode_line's bf16 values v (u = q + 128 for int8, 128 + u = 136 + q for int4: offset 128 or
 * 136). A k-pair's 32 values widen
 * to fp32 as outputs 0-7 and 8-15, two inputs each, so the per-output scales are spread the
 * same way, once per group. */
static inline __attribute__((always_inline)) void dequantize_block(
        const linear_t *l, const int BITS, int64_t b, uint16_t *dst) {
    const int64_t k = l->k_in, pairs_per_line = BITS == 8 ? 2 : 4;
    const int64_t lines_per_group = l->group / (2 * pairs_per_line);
    const lines_t src = block_lines(l, BITS, b);
    const __m512i spread[2] = {
        _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8)};
    for (int64_t g = 0; g < k / l->group; g++) {
        __m512 scale = bf16x16_to_f32(block_groups(l->group_scale, l, b) + g * 16);
        __m512 shift = _mm512_set1_ps(BITS == 8 ? 128.0f : 136.0f);
        if (l->group_zero) shift = _mm512_add_ps(shift, bf16x16_to_f32(block_groups(l->group_zero, l, b) + g * 16));
        shift = _mm512_mul_ps(shift, scale);
        __m512 s[2], z[2];
        for (int h = 0; h < 2; h++) {
            s[h] = _mm512_permutexvar_ps(spread[h], scale);
            z[h] = _mm512_permutexvar_ps(spread[h], shift);
        }
        for (int64_t line = g * lines_per_group; line < (g + 1) * lines_per_group; line++) {
            __m512bh v[4];
            /* without, the model's W8A16 linears at 65 rows took 26.5 ms, not 14.5 (the codes
             * came from memory a line at a time) */
            _mm_prefetch((const char *)src.start + (line + 32) * src.stride, _MM_HINT_T0);
            _mm_prefetch((const char *)src.start + (line + 96) * src.stride, _MM_HINT_T1);
            decode_line(src.start + line * src.stride, BITS, v);
            for (int i = 0; i < pairs_per_line; i++) {
                __m512i words = (__m512i)v[i];
                __m512 w[2];
                for (int h = 0; h < 2; h++) {
                    __m256i half = h ? _mm512_extracti64x4_epi64(words, 1) : _mm512_castsi512_si256(words);
                    w[h] = _mm512_fmsub_ps(bf16x16_widen(half), s[h], z[h]);
                }
                _mm512_storeu_si512(dst + (line * pairs_per_line + i) * 32,
                                    (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
            }
        }
    }
}

/* A widen_t's blocks for an int8 or int4 linear_t: output blocks [first, first + count)
 * dequantized (dequantize_block). */
static void dequantized_blocks(const void *weight, int64_t first, int64_t count, uint16_t *dst) {
    const linear_t *l = weight;
    for (int64_t b = first; b < first + count; b++) {
        if (l->kind == LINEAR_INT8) dequantize_block(l, 8, b, dst + (b - first) * (l->k_in / 2) * 32);
        else dequantize_block(l, 4, b, dst + (b - first) * (l->k_in / 2) * 32);
    }
}

/* y [rows, N] = x [rows, K] (row stride x_stride) @ W^T (+ bias), for any kind of linear_t.
 * Returns 0, or -2 when out of memory. */
int linear_forward(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                   uint16_t *y) {
    if (l->kind == LINEAR_BF16)
        return bf16_linear(x, x_stride, rows, l->weight, l->bias, y, 2, l->n_out, l->k_in);
    if (l->kind == LINEAR_W8A8 || l->kind == LINEAR_FP8) return dynamic_linear(l, x, x_stride, rows, y);
    if (rows <= KERNEL_MAX_ROWS) return quant_kernel(l, x, x_stride, rows, y);
    const widen_t widen = {dequantized_blocks, l};
    return widened_gemm(x, x_stride, rows, &widen, l->k_in, NULL, NULL, l->bias, y, l->n_out);
}

/* y [rows, N/2] = silu(gate) * up of a gate_up layer's outputs [rows, N] (the gate's first), as
 * linear_forward and then silu_and_mul give them: both [rows, N] is their scratch, which
 * bf16_glu, dynamic_glu and widened_glu do not need where they fuse the two. Returns 0, or -2
 * when out of memory. */
int glu_forward(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *both,
                uint16_t *y) {
    const int64_t inter = l->n_out / 2;
    int status = 1;  /* fused where amx_gemm takes the rows */
    if (l->kind == LINEAR_BF16) status = bf16_glu(x, x_stride, rows, l->weight, l->bias, y, inter, l->k_in);
    if (l->kind == LINEAR_W8A8 || l->kind == LINEAR_FP8) status = dynamic_glu(l, x, x_stride, rows, y);
    if ((l->kind == LINEAR_INT8 || l->kind == LINEAR_INT4) && rows > KERNEL_MAX_ROWS) {
        const widen_t widen = {dequantized_blocks, l};
        status = widened_glu(x, x_stride, rows, &widen, l->k_in, NULL, NULL, l->bias, y, inter);
    }
    if (status != 1) return status;
    status = linear_forward(l, x, x_stride, rows, both);
    if (!status) silu_and_mul(both, y, rows, inter, 2);
    return status;
}

int has_quant_linear(void) { return 1; }
#else
int has_quant_linear(void) { return 0; }
#endif

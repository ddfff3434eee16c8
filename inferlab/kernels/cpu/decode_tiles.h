/* The decode attention kernels' building blocks (included by decode_attention.c and
 * decode_prefix.c, and by prefill_attention.c for the same sums): the softmax rows, the
 * AVX512-BF16 register kernels that read a token's paged keys and values 16 positions at a time,
 * and a token's attention from a given position on. */
#ifndef INFERLAB_DECODE_TILES_H
#define INFERLAB_DECODE_TILES_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Floats between rows of scores: the bf16 weights written over them in place (weights_to_pairs)
 * take round_up(len, 32) positions' room. */
static inline int64_t row_floats(int64_t len) { return round_up(len, 32); }

/* Softmax numerators in place (scores already scaled, rows stride floats apart) for rows
 * [r0, r1); sums to total[r]. */
static inline __attribute__((always_inline)) void softmax_rows(
        float *scores, int64_t r0, int64_t r1, int64_t len, int64_t stride, float *total) {
#ifdef __AVX512BF16__
    for (int64_t r = r0; r < r1; r++) total[r] = softmax_numerators_ps(scores + r * stride, len, NULL, 0);
#else
    for (int64_t r = r0; r < r1; r++) {
        float *sr = scores + r * stride, top = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : top)
        for (int64_t p = 0; p < len; p++) top = sr[p] > top ? sr[p] : top;
#pragma omp simd reduction(+ : sum)
        for (int64_t p = 0; p < len; p++) {
            sr[p] = exp_nonpositive(sr[p] - top);
            sum += sr[p];
        }
        total[r] = sum;
    }
#endif
}

#ifdef __AVX512BF16__

/* out lane j = the sum of v[j]'s 16 lanes: a transpose-and-add tree, 45 shuffles and adds for
 * 16 dot products instead of 16 horizontal reductions. */
static inline __attribute__((always_inline)) __m512 sum_lanes_16(const __m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                                 _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                               _mm512_shuffle_f32x4(quads[0], quads[1], 0xdd));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                               _mm512_shuffle_f32x4(quads[2], quads[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
}

/* A prefetch of positions [p0, p0 + 32), all heads of the range, each through the block table:
 * the two chunks from p0. Where a loop over chunks starts, so that its first two do not come
 * from memory on demand; and ahead of each chunk when blocks are smaller than a chunk. */
static inline __attribute__((always_inline)) void prefetch_two_chunks(const uint16_t *cache,
                                                                     span_t s, int64_t p0) {
    const int64_t bytes = (s.h1 - s.h0) * s.dim * 2;
    for (int64_t p = p0; p < p0 + 32 && p < s.len; p++) {
        const char *at = (const char *)(cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, s.h0, s.dim));
        prefetch_lines(at, bytes);
    }
}

/* An ask for the chunk of 16 positions from c (a multiple of 16, in blocks of 16 or more: 16
 * rows of one block), all heads of the range: into L1, or into L2 only (`l2`). */
static inline __attribute__((always_inline)) void prefetch_chunk(const uint16_t *cache, span_t s,
                                                                int64_t c, const int l2) {
    const int64_t bytes = (s.h1 - s.h0) * s.dim * 2, row = s.num_kv_heads * s.dim;
    if (c >= s.len) return;
    const char *at = (const char *)(cache + kv_offset(s.table, c, s.block_size, s.num_kv_heads, s.h0, s.dim));
    for (int64_t i = 0; i < 16 && c + i < s.len; i++, at += row * 2)
        for (int64_t b = 0; b < bytes; b += 64) {
            if (l2) _mm_prefetch(at + b, _MM_HINT_T1);
            else _mm_prefetch(at + b, _MM_HINT_T0);
        }
}

/* How far ahead (positions) the register kernels ask L2 for the keys and values, besides asking
 * L1 one and two chunks ahead: L1 has room for few requests in flight, and a chunk (6 KB for
 * the embedded model's 3 KV heads) takes longer to arrive from memory than to multiply. On an
 * AMD EPYC (Zen 4), 30 layers' decode attention from memory went 31.1 -> 22.7 ms (64 tokens x
 * 318 positions), 36.5 -> 23.6 (the same over blocks in random order), 61.5 -> 48.4 (64 x 830,
 * 512 shared), 12.6 -> 8.9 (16 x 500), 1.05 -> 0.90 (one token x 228); 64 positions ahead
 * alike, 16 and 32 less. */
#define L2_AHEAD 48

/* Rows of the 16 positions from p0 (past the end: position p0 again, its results unused), at
 * head h0; and a prefetch of the chunks after them, all heads of the range. The blocks are
 * scattered, so the hardware prefetchers do not see them coming. With `twice`, each line is
 * asked for two chunks and one chunk ahead, and L2 for L2_AHEAD positions ahead: on an AMD EPYC
 * (Zen 5), 64 tokens of 420 positions over blocks in random order took 41 -> 22 ns a position
 * (asking one chunk ahead twice: 23; only two chunks ahead: 32), so the first request is often
 * lost. Blocks in order: no change. On the Intel Xeon with AMX the second asks stalled on its
 * 16 fill buffers instead: the AMX decode asks once, two chunks ahead (16 tokens of 400
 * positions from memory, 30 layers: 10.0-10.2 -> 9.2-9.5 ms). Blocks smaller than a chunk,
 * position by position, ask twice either way. */
static inline __attribute__((always_inline)) int chunk_rows(const uint16_t *cache, span_t s,
                                                            int64_t p0, const uint16_t *rows[16],
                                                            const int twice) {
    int n = s.len - p0 < 16 ? (int)(s.len - p0) : 16;
    if (s.block_size < 16) {  /* a chunk spans blocks: position by position */
        for (int i = 0; i < 16; i++)
            rows[i] = cache + kv_offset(s.table, p0 + (i < n ? i : 0), s.block_size, s.num_kv_heads, s.h0, s.dim);
        prefetch_two_chunks(cache, s, p0 + 16);
        return n;
    }
    /* p0 a multiple of 16 and blocks of 16 or more (powers of two): a chunk is 16 rows of one
     * block, num_kv_heads * dim elements apart, found with one lookup in the table */
    const uint16_t *first = cache + kv_offset(s.table, p0, s.block_size, s.num_kv_heads, s.h0, s.dim);
    for (int i = 0; i < 16; i++) rows[i] = first + (i < n ? i : 0) * s.num_kv_heads * s.dim;
    for (int64_t c = p0 + (twice ? 16 : 32); c < p0 + 48; c += 16) prefetch_chunk(cache, s, c, 0);
    if (twice) prefetch_chunk(cache, s, p0 + L2_AHEAD, 1);
    return n;
}

/* Row (h, g)'s scores[(h * head_rows + g) * stride + p] = scale * q . k_p for bf16 q (the
 * range's query rows, contiguous) and K, head dim a multiple of 32 (at most 256), positions
 * [p_lo, p_hi) (p_lo a multiple of 16): vdpbf16ps sums exact bf16 products in fp32, 16
 * positions at a time, all heads of the range per chunk so the chunk's keys are read from
 * memory once, front to back. Each lane of a dot product takes the dims 2j, 2j + 1, 32 + 2j, ...
 * in order; sum_lanes_16 then adds the lanes (prefix_scores sums the same way). */
static inline __attribute__((always_inline)) void scores_bf16(
        const uint16_t *q, const uint16_t *k_cache, span_t s, float scale, float *scores,
        int64_t stride, int64_t head_rows, int64_t p_lo, int64_t p_hi) {
    const int chunks = (int)(s.dim / 32);
    const __m512 scale_v = _mm512_set1_ps(scale);
    for (int64_t p0 = p_lo; p0 < p_hi; p0 += 16) {
        const uint16_t *k[16];
        int n = chunk_rows(k_cache, s, p0, k, 1);
        for (int64_t r = 0, h = 0; h < s.h1 - s.h0; h++)  /* r = h * group + g, no division */
            for (int64_t g = 0; g < s.group; g++, r++) {
                const uint16_t *qr = q + (s.h0 * s.group + r) * s.dim;
                __m512 dots[16];
                for (int i = 0; i < 16; i++) {
                    dots[i] = _mm512_setzero_ps();
                    for (int c = 0; c < chunks; c++)
                        dots[i] = _mm512_dpbf16_ps(dots[i], (__m512bh)_mm512_loadu_si512(qr + 32 * c),
                                                   (__m512bh)_mm512_loadu_si512(k[i] + h * s.dim + 32 * c));
                }
                __m512 sums = _mm512_mul_ps(sum_lanes_16(dots), scale_v);
                _mm512_mask_storeu_ps(scores + (h * head_rows + g) * stride + p0,
                                      (__mmask16)((1u << n) - 1), sums);
            }
    }
}

/* The scores of 4 query rows (bf16, q_stride elements apart) for the 16 positions of one K^T
 * chunk of layout_head (kt: [D/32][16 pairs][16 positions]), bit for bit as scores_bf16 sums
 * them: lane j of a position's dot product is a vdpbf16ps chain over the dim pairs j, 16 + j,
 * ..., and the lanes add up in sum_lanes_16's tree, ((l0 + l2) + (l1 + l3)) within each group of
 * four, then (x0 + x1) + (x2 + x3). Here a lane is a register of 16 positions, so the tree costs
 * 15 adds and the chunk's keys are read once for the 4 rows. prefix_quarter: x[r] for row r's
 * lanes 4 * quarter ... 4 * quarter + 3. */
static inline __attribute__((always_inline)) void prefix_quarter(
        const uint16_t *q, int64_t q_stride, const uint32_t *kt, const int K_STEPS, int quarter,
        __m512 x[4]) {
    __m512 lane[4][4];
    for (int m = 0; m < 4; m++) {
        const int j = 4 * quarter + m;
        for (int r = 0; r < 4; r++) lane[r][m] = _mm512_setzero_ps();
        for (int k = 0; k < K_STEPS; k++) {
            const __m512bh keys = (__m512bh)_mm512_loadu_si512(kt + (k * 16 + j) * 16);
            for (int r = 0; r < 4; r++)
                lane[r][m] = _mm512_dpbf16_ps(lane[r][m], keys, broadcast_pair(q + r * q_stride, 16 * k + j));
        }
    }
    for (int r = 0; r < 4; r++)
        x[r] = _mm512_add_ps(_mm512_add_ps(lane[r][0], lane[r][2]), _mm512_add_ps(lane[r][1], lane[r][3]));
}

static inline __attribute__((always_inline)) void prefix_scores_tile(
        const uint16_t *q, int64_t q_stride, const uint32_t *kt, const int K_STEPS, float scale,
        float *scores, int64_t stride) {
    __m512 x0[4], x1[4];
    prefix_quarter(q, q_stride, kt, K_STEPS, 0, x0);
    prefix_quarter(q, q_stride, kt, K_STEPS, 1, x1);
    for (int r = 0; r < 4; r++) x0[r] = _mm512_add_ps(x0[r], x1[r]);
    __m512 x2[4], x3[4];
    prefix_quarter(q, q_stride, kt, K_STEPS, 2, x2);
    prefix_quarter(q, q_stride, kt, K_STEPS, 3, x3);
    for (int r = 0; r < 4; r++) {
        const __m512 sum = _mm512_add_ps(x0[r], _mm512_add_ps(x2[r], x3[r]));
        _mm512_storeu_ps(scores + r * stride, _mm512_mul_ps(sum, _mm512_set1_ps(scale)));
    }
}

/* Scores of `rows` query rows (a multiple of 4, bf16, D apart) against the first `shared`
 * positions (a multiple of 16) of layout_head's K^T tiles, summed as scores_bf16 sums them: a
 * decode token's shared prefix, and a prefill's query tiles, so that a token's scores do not
 * depend on the kernel that ran it. */
static inline void prefix_scores(const uint16_t *qbuf, int64_t rows, const uint32_t *kt,
                                 int64_t shared, int64_t dim, float scale, float *scores,
                                 int64_t stride) {
    const int64_t k_steps = dim / 32;
    for (int64_t c = 0; c < shared / 16; c++)
        for (int64_t r = 0; r < rows; r += 4) {
            const uint16_t *qr = qbuf + r * dim;
            const uint32_t *chunk = kt + c * k_steps * 256;
            float *sr = scores + r * stride + c * 16;
            if (k_steps == 2) prefix_scores_tile(qr, dim, chunk, 2, scale, sr, stride);
            else if (k_steps == 4) prefix_scores_tile(qr, dim, chunk, 4, scale, sr, stride);
            else prefix_scores_tile(qr, dim, chunk, (int)k_steps, scale, sr, stride);
        }
}

/* Values of positions [p0, p0 + 32) (zeros past s.len) of KV head h, dims [d0, d0 + dims) (dims
 * a multiple of 32), as B tiles of vdpbf16ps pairs: tile t holds dims d0 + 16t .. + 15, its row
 * i positions p0 + 2i and p0 + 2i + 1 interleaved dim by dim (a[0] b[0] a[1] b[1] ...). */
static inline void pair_values(const uint16_t *v_cache, span_t s, int64_t h, int64_t p0,
                               int64_t d0, int64_t dims, uint16_t *tiles) {
    static const uint16_t interleave[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                            8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(interleave), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t i = 0; i < 16; i++) {
        const int64_t p = p0 + 2 * i;
        const uint16_t *a = p < s.len ? v_cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, h, s.dim) : NULL;
        const uint16_t *b = p + 1 < s.len ? v_cache + kv_offset(s.table, p + 1, s.block_size, s.num_kv_heads, h, s.dim) : NULL;
        for (int64_t d = 0; d < dims; d += 32) {
            const __m512i va = a ? _mm512_loadu_si512(a + d0 + d) : _mm512_setzero_si512();
            const __m512i vb = b ? _mm512_loadu_si512(b + d0 + d) : _mm512_setzero_si512();
            _mm512_storeu_si512(tiles + (d / 16) * 512 + i * 32, _mm512_permutex2var_epi16(va, lo, vb));
            _mm512_storeu_si512(tiles + (d / 16 + 1) * 512 + i * 32, _mm512_permutex2var_epi16(va, hi, vb));
        }
    }
}

/* A row's softmax weights (fp32, len of them) as bf16 in place, two positions to a 32-bit pair,
 * zeros up to the next multiple of 32 positions: rows must lie at least round_up(len, 32)
 * floats apart. Writing 64 bytes at 2p never reaches floats not yet read (at 4p + 128). */
static inline void weights_to_pairs(float *row, int64_t len) {
    uint16_t *pairs = (uint16_t *)row;
    for (int64_t p = 0; p < len; p += 32) {
        const int64_t left = len - p;
        const __mmask16 lo = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __mmask16 hi = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(lo, row + p), b = _mm512_maskz_loadu_ps(hi, row + p + 16);
        _mm512_storeu_si512(pairs + p, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* acc[g] (GN rows of CH x 16 floats, acc_row apart) += the chunk's n positions' values weighted
 * by w (bf16 pairs: row g's from w + g * w_row, pair i/2 for positions i, i + 1): one vdpbf16ps
 * takes two positions, their rows interleaved 16 bits apart by unpacklo/hi. So acc holds each
 * 32 dims in unpack order (see pairs_order_index). Past n, the weights are zeros. */
static inline __attribute__((always_inline)) void values_tile(
        const uint16_t *const v[16], int n, const uint32_t *w, int64_t w_row, float *acc,
        int64_t acc_row, const int GN, const int CH) {
    __m512 sum[16];
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < CH; c++) sum[g * CH + c] = _mm512_loadu_ps(acc + g * acc_row + c * 16);
    for (int i = 0; i < n; i += 2)
        for (int c = 0; c < CH; c += 2) {
            const __m512i a = _mm512_loadu_si512(v[i] + 16 * c), b = _mm512_loadu_si512(v[i + 1] + 16 * c);
            const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
            for (int g = 0; g < GN; g++) {
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)w[g * w_row + i / 2]);
                sum[g * CH + c] = _mm512_dpbf16_ps(sum[g * CH + c], lo, p);
                sum[g * CH + c + 1] = _mm512_dpbf16_ps(sum[g * CH + c + 1], hi, p);
            }
        }
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < CH; c++) _mm512_storeu_ps(acc + g * acc_row + c * 16, sum[g * CH + c]);
}

/* values_tile over the query rows g0, g0 + 1, ... of one head, `left` of them, in the widest
 * tile of up to 4 rows that fits the registers; returns how many rows it took. Tile shapes do
 * not change a row's arithmetic (each sum takes its positions in order), only the loads. */
static inline __attribute__((always_inline)) int64_t values_rows(
        const uint16_t *const v[16], int n, const uint32_t *w, int64_t w_row, float *acc,
        int64_t acc_row, int64_t left, const int CH) {
    if (left >= 4 && 4 * CH <= 16) { values_tile(v, n, w, w_row, acc, acc_row, 4, CH); return 4; }
    if (left == 3 && 3 * CH <= 16) { values_tile(v, n, w, w_row, acc, acc_row, 3, CH); return 3; }
    if (left >= 2 && 2 * CH <= 16) { values_tile(v, n, w, w_row, acc, acc_row, 2, CH); return 2; }
    values_tile(v, n, w, w_row, acc, acc_row, 1, CH);
    return 1;
}

/* Where unpacklo/hi put a 32-dim slice's dims: lanes 0-15 hold dims {0-3, 8-11, 16-19, 24-27},
 * lanes 16-31 the others. index[d] is the lane of dim d, for _mm512_permutex2var_ps over the
 * slice's two vectors; `inverse` gives dim order's lanes instead. */
static inline __m512i pairs_order_index(int half, int inverse) {
    int32_t index[16];
    for (int k = 0; k < 16; k++) {
        const int i = 16 * half + k;  /* the output's element */
        index[k] = inverse ? i % 16 / 4 * 8 + i / 16 * 4 + i % 4  /* lane i holds this dim */
                           : (i % 8 >= 4) * 16 + i / 8 * 4 + i % 4;  /* dim i is in this lane */
    }
    return _mm512_loadu_si512(index);
}

/* n floats (a multiple of 32) from unpack order to dim order, or back (`inverse`). */
static inline void reorder_pairs(float *x, int64_t n, int inverse) {
    const __m512i first = pairs_order_index(0, inverse), second = pairs_order_index(1, inverse);
    for (int64_t i = 0; i < n; i += 32) {
        const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        _mm512_storeu_ps(x + i, _mm512_permutex2var_ps(a, first, b));
        _mm512_storeu_ps(x + i + 16, _mm512_permutex2var_ps(a, second, b));
    }
}

/* A row's finished sums (n floats in unpack order) divided by its softmax total and stored as
 * bf16 at out. */
static inline void store_row(float *x, int64_t n, float total, uint16_t *out) {
    const float inv = 1.0f / total;
    reorder_pairs(x, n, 0);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
    store_f32(x, 2, out, n);
}

/* acc[h * acc_head + g] (h of the range, g < group; acc_row floats a row) += the values of
 * positions [from, len) weighted by w (bf16 pairs, row (h, g) at w + (h * w_head + g) * w_row
 * 32-bit pairs), for bf16 V, head dim a multiple of 32 (<= 256): chunk by chunk of 16
 * positions, each head's query rows in register tiles of as many rows (up to 4) as fit.
 * from: a multiple of 16. */
static inline __attribute__((always_inline)) void values_bf16(
        const uint16_t *v_cache, span_t s, int64_t from, const uint32_t *w, int64_t w_row,
        int64_t w_head, float *acc, int64_t acc_head) {
    const int ch = (int)(s.dim / 16);
    for (int64_t p0 = from; p0 < s.len; p0 += 16) {
        const uint16_t *v[16], *vh[16];
        int n = chunk_rows(v_cache, s, p0, v, 1);
        for (int64_t h = 0; h < s.h1 - s.h0; h++) {
            for (int i = 0; i < 16; i++) vh[i] = v[i] + h * s.dim;
            for (int64_t g0 = 0; g0 < s.group;)
                g0 += values_rows(vh, n, w + (h * w_head + g0) * w_row + p0 / 2, w_row,
                                  acc + (h * acc_head + g0) * s.dim, s.dim, s.group - g0, ch);
        }
    }
}

/* A token's rows of work for its span's KV heads: row (h, g) at scores + (h * head_rows + g) *
 * stride (fp32 scores, then the bf16 weight pairs written over them), its sums at acc +
 * (h * head_rows + g) * D, its softmax total at total[h * head_rows + g]. */
typedef struct {
    float *scores, *acc, *total;
    int64_t stride, head_rows;
} rows_t;

/* Scores of positions [from, len) (a multiple of 16; those before it already in place), the
 * softmax over all len, and the weights as bf16 pairs. */
static inline __attribute__((always_inline)) void attend_weights(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, span_t s, float scale,
        int64_t from, rows_t w) {
    prefetch_two_chunks(k_cache, s, from);
    prefetch_two_chunks(v_cache, s, from);
    if (s.block_size >= 16)  /* L2's stream starts where chunk_rows' asks do not reach early */
        for (int64_t c = from + 32; c < from + L2_AHEAD; c += 16) {
            prefetch_chunk(k_cache, s, c, 1);
            prefetch_chunk(v_cache, s, c, 1);
        }
    scores_bf16(q, k_cache, s, scale, w.scores, w.stride, w.head_rows, from, s.len);
    for (int64_t h = 0; h < s.h1 - s.h0; h++) {
        float *head = w.scores + h * w.head_rows * w.stride;
        softmax_rows(head, 0, s.group, s.len, w.stride, w.total + h * w.head_rows);
        for (int64_t g = 0; g < s.group; g++) weights_to_pairs(head + g * w.stride, s.len);
    }
}

/* The sums over positions [from, len) added to those before (zeros when from is 0), divided by
 * the totals and stored as the token's bf16 outputs (out: its row [Hq, D]). */
static inline __attribute__((always_inline)) void attend_values(
        const uint16_t *v_cache, span_t s, int64_t from, rows_t w, uint16_t *out) {
    const int64_t heads = s.h1 - s.h0;
    if (from == 0)
        for (int64_t h = 0; h < heads; h++)
            memset(w.acc + h * w.head_rows * s.dim, 0, sizeof(float) * (size_t)(s.group * s.dim));
    values_bf16(v_cache, s, from, (const uint32_t *)w.scores, w.stride, w.head_rows, w.acc, w.head_rows);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t g = 0; g < s.group; g++)
            store_row(w.acc + (h * w.head_rows + g) * s.dim, s.dim, w.total[h * w.head_rows + g],
                      out + ((s.h0 + h) * s.group + g) * s.dim);
}

/* attend_weights, or attend_values (`values`), with the common head dims as constants. */
static inline void attend_part(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               span_t s, float scale, int64_t from, rows_t w, uint16_t *out,
                               int values) {
    if (values && s.dim == 64) { s.dim = 64; attend_values(v_cache, s, from, w, out); }
    else if (values && s.dim == 128) { s.dim = 128; attend_values(v_cache, s, from, w, out); }
    else if (values) attend_values(v_cache, s, from, w, out);
    else if (s.dim == 64) { s.dim = 64; attend_weights(q, k_cache, v_cache, s, scale, from, w); }
    else if (s.dim == 128) { s.dim = 128; attend_weights(q, k_cache, v_cache, s, scale, from, w); }
    else attend_weights(q, k_cache, v_cache, s, scale, from, w);
}

/* The shortest shared prefix decode_with_prefix takes: below it, laying out the prefix's tiles
 * costs about what sharing them saves. */
#define PREFIX_MIN_POSITIONS 64

/* decode_prefix.c: the positions every listed decode token's sequence holds in the same blocks,
 * and the decode of such a batch with that prefix read once for all (see there). */
int64_t shared_prefix(const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                      const int32_t *seqs, int64_t num_decodes, int64_t block_size);
int decode_with_prefix(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                       const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                       const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                       int64_t num_decodes, uint16_t *out, span_t s, int64_t shared, float scale);
/* The prefix's layout_head tiles, laid out once for the batch (decode_prefix.c and decode_amx.c's
 * cascades): bytes a KV head, and the layout, shared out in an enclosing parallel region. */
int64_t prefix_tile_bytes(int64_t shared, int64_t dim);
void layout_prefix(const uint16_t *k_cache, const uint16_t *v_cache, span_t prefix, uint8_t *tiles);
#endif
#endif

/* The decode attention kernels' building blocks (included by decode_attention.c only): where
 * the softmax weights lie, and the AVX512-BF16 register kernels that read a token's paged keys
 * and values 16 positions at a time. */
#ifndef INFERLAB_DECODE_TILES_H
#define INFERLAB_DECODE_TILES_H
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Where the softmax weights of query row (head h of the range, g) at position p lie in the
 * scratch: rows of len floats (the generic and AVX512-BF16 paths), or scores_amx's bands of
 * heads, 16 lanes a position. */
typedef struct { int64_t band, band_stride, row, pos; } weights_layout;

static inline int64_t weight_offset(weights_layout l, int64_t group, int64_t h, int64_t g,
                                    int64_t p) {
    return h / l.band * l.band_stride + (h % l.band * group + g) * l.row + p * l.pos;
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
        for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(at + off, _MM_HINT_T0);
    }
}

/* Rows of the 16 positions from p0 (past the end: position p0 again, its results unused), at
 * head h0; and a prefetch of the 32 after them, all heads of the range. The blocks are
 * scattered, so the hardware prefetchers do not see them coming. Each line is thus asked for
 * twice, two chunks and one chunk ahead: on an AMD EPYC (Zen 5), 64 tokens of 420 positions
 * over blocks in random order took 41 -> 22 ns a position (asking one chunk ahead twice: 23;
 * only two chunks ahead: 32), so the first request is often lost. Blocks in order: no change. */
static inline __attribute__((always_inline)) int chunk_rows(const uint16_t *cache, span_t s,
                                                            int64_t p0, const uint16_t *rows[16]) {
    int n = s.len - p0 < 16 ? (int)(s.len - p0) : 16;
    const int64_t bytes = (s.h1 - s.h0) * s.dim * 2, row = s.num_kv_heads * s.dim;
    if (s.block_size < 16) {  /* a chunk spans blocks: position by position */
        for (int i = 0; i < 16; i++)
            rows[i] = cache + kv_offset(s.table, p0 + (i < n ? i : 0), s.block_size, s.num_kv_heads, s.h0, s.dim);
        prefetch_two_chunks(cache, s, p0 + 16);
        return n;
    }
    /* p0 a multiple of 16 and blocks of 16 or more (powers of two): a chunk is 16 rows of one
     * block, `row` elements apart, found with one lookup in the table */
    const uint16_t *first = cache + kv_offset(s.table, p0, s.block_size, s.num_kv_heads, s.h0, s.dim);
    for (int i = 0; i < 16; i++) rows[i] = first + (i < n ? i : 0) * row;
    for (int64_t c = p0 + 16; c < p0 + 48 && c < s.len; c += 16) {
        const char *next = (const char *)(cache + kv_offset(s.table, c, s.block_size, s.num_kv_heads, s.h0, s.dim));
        for (int64_t i = 0; i < 16 && c + i < s.len; i++, next += row * 2)
            for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    }
    return n;
}

/* scores[r*len + p] = scale * q_r . k_p for bf16 q and K, head dim a multiple of 32 (at most
 * 256), positions [p_lo, p_hi) (p_lo a multiple of 16): vdpbf16ps sums exact bf16 products in
 * fp32, 16 positions at a time, all heads of the range per chunk so the chunk's keys are read
 * from memory once, front to back. */
static inline __attribute__((always_inline)) void scores_bf16(
        const uint16_t *q, const uint16_t *k_cache, span_t s, float scale, float *scores,
        int64_t p_lo, int64_t p_hi) {
    const int chunks = (int)(s.dim / 32);
    const __m512 scale_v = _mm512_set1_ps(scale);
    for (int64_t p0 = p_lo; p0 < p_hi; p0 += 16) {
        const uint16_t *k[16];
        int n = chunk_rows(k_cache, s, p0, k);
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
                _mm512_mask_storeu_ps(scores + r * s.len + p0, (__mmask16)((1u << n) - 1), sums);
            }
    }
}

/* acc[0 .. GN) += sum_i w[g*w_row + i*w_pos] * v[i] over a chunk's n positions, head dim
 * CH x 16, the GN x CH sums in registers (GN * CH <= 16). Each 32 values of V widen in two
 * instructions, not four: shifted up 16 bits, a 32-bit lane holds the even element of its pair;
 * masked, the odd one. So acc holds each 32 dims as their 16 even then their 16 odd ones
 * (interleave_pairs). */
static inline __attribute__((always_inline)) void values_tile(
        const uint16_t *const v[16], int n, const float *w, int64_t w_row, int64_t w_pos,
        float *acc, int64_t acc_row, const int GN, const int CH) {
    const __m512i high_half = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 sum[16];
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < CH; c++) sum[g * CH + c] = _mm512_loadu_ps(acc + g * acc_row + c * 16);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < CH; c += 2) {
            __m512i pairs = _mm512_loadu_si512(v[i] + 16 * c);
            __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
            __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half));
            for (int g = 0; g < GN; g++) {
                __m512 p = _mm512_set1_ps(w[g * w_row + i * w_pos]);
                sum[g * CH + c] = _mm512_fmadd_ps(p, even, sum[g * CH + c]);
                sum[g * CH + c + 1] = _mm512_fmadd_ps(p, odd, sum[g * CH + c + 1]);
            }
        }
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < CH; c++) _mm512_storeu_ps(acc + g * acc_row + c * 16, sum[g * CH + c]);
}

/* values_tile over the query rows g0, g0 + 1, ... of one head, `left` of them, in the widest
 * tile of up to 4 rows that fits the registers; returns how many rows it took. Tile shapes do
 * not change a row's arithmetic (each sum takes its positions in order), only the loads. */
static inline __attribute__((always_inline)) int64_t values_rows(
        const uint16_t *const v[16], int n, const float *w, int64_t w_row, int64_t w_pos,
        float *acc, int64_t acc_row, int64_t left, const int CH) {
    if (left >= 4 && 4 * CH <= 16) { values_tile(v, n, w, w_row, w_pos, acc, acc_row, 4, CH); return 4; }
    if (left == 3 && 3 * CH <= 16) { values_tile(v, n, w, w_row, w_pos, acc, acc_row, 3, CH); return 3; }
    if (left >= 2 && 2 * CH <= 16) { values_tile(v, n, w, w_row, w_pos, acc, acc_row, 2, CH); return 2; }
    values_tile(v, n, w, w_row, w_pos, acc, acc_row, 1, CH);
    return 1;
}

/* n floats laid out as values_tile leaves them (per 32: 16 even, 16 odd) back in order. */
static inline void interleave_pairs(float *x, int64_t n) {
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t i = 0; i < n; i += 32) {
        __m512 even = _mm512_loadu_ps(x + i), odd = _mm512_loadu_ps(x + i + 16);
        _mm512_storeu_ps(x + i, _mm512_permutex2var_ps(even, first, odd));
        _mm512_storeu_ps(x + i + 16, _mm512_permutex2var_ps(even, second, odd));
    }
}

/* acc[r] = sum_p w(r, p) * v_p in fp32 for bf16 V, head dim a multiple of 32 (<= 256), the
 * weights where `l` puts them: chunk by chunk of 16 positions, each head's query rows in
 * register tiles (for head dims 64 and 128; one row at a time otherwise). */
static inline __attribute__((always_inline)) void values_bf16(
        const uint16_t *v_cache, span_t s, const float *w, weights_layout l, float *acc) {
    const int ch = (int)(s.dim / 16);
    memset(acc, 0, (size_t)(s.h1 - s.h0) * s.group * s.dim * sizeof(float));
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
        const uint16_t *v[16], *vh[16];
        int n = chunk_rows(v_cache, s, p0, v);
        for (int64_t h = 0; h < s.h1 - s.h0; h++) {
            for (int i = 0; i < 16; i++) vh[i] = v[i] + h * s.dim;
            for (int64_t g0 = 0; g0 < s.group;)
                g0 += values_rows(vh, n, w + weight_offset(l, s.group, h, g0, p0), l.row, l.pos,
                                  acc + (h * s.group + g0) * s.dim, s.dim, s.group - g0, ch);
        }
    }
}
#endif
#endif

/* The attention kernels' products over layout_head's tiles (prefill_attention.c): a prompt's
 * query tiles, and decode_amx.c's and decode_prefix.c's shared prefixes, multiply the same
 * layouts the same way, so that a token gets the same bits from each. On AMX tiles, and on
 * AVX512 register tiles where there are none (vnni_product inline, so that each caller's
 * constant strides shape its loops). */
#ifndef INFERLAB_ATTENTION_TILES_H
#define INFERLAB_ATTENTION_TILES_H
#include <stdint.h>

#include "kernels.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

static inline int64_t key_tile_bytes(int64_t len, int64_t dim) {  /* the values' tiles follow */
    return round_up(len, 16) * dim * 2;
}

/* out[d] = sums[d] / total as bf16, for dims (a multiple of 16) of a row's finished sums. */
static inline void store_divided(const float *sums, int64_t dims, float total, uint16_t *out) {
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int64_t d = 0; d < dims; d += 16) store_bf16(out + d, _mm512_mul_ps(_mm512_loadu_ps(sums + d), inv));
}

/* A query tile's softmax, its rows taken a few at a time beside another tile's tile products
 * (`beside` below; see prefill_attention.c's query_pair): row r < rows sees row_len0 + r
 * positions of scores, the others none (zero weights); the numerators go to probs as bf16, the
 * sums to total. The softmax is half of a prefill's attention, and AVX512 runs it while the
 * tiles multiply (30 layers' attention of 8 prompts of 256 tokens after 512 cached positions:
 * 117-118 -> 108-110 ms; of a 2,048-token prompt 167-169 -> 162-164 ms; shares finer than a
 * row, resuming within rows, gave the same). */
typedef struct {
    float *scores, *total;
    uint16_t *probs;
    int64_t width, rows, row_len0, next;  /* next: the first row not yet done */
} softmax_rows_t;

static inline void softmax_upto(softmax_rows_t *j, int64_t upto) {
    if (!j) return;
    for (; j->next < upto; j->next++) {
        const int64_t r = j->next, n = r < j->rows ? j->row_len0 + r : 0;
        j->total[r] = softmax_numerators_ps(j->scores + r * j->width, n, j->probs + r * j->width, j->width);
    }
}

#if defined(__AMX_BF16__)
/* C tiles 0-3 += 16 weight rows (bf16, w_bytes apart) over 32 positions times those positions'
 * values in pair tiles 512 elements apart (dims 0-15, 16-31, ...): four tiles, or two (32 dims)
 * when not `four`. The AMX prefill and decode multiply their values by this one sequence; the
 * value tiles load with the streaming hint (see prefill_attention.c's tile_scores). */
static inline void amx_weighted_values(const uint16_t *w, int64_t w_bytes, const uint16_t *v, int four) {
    _tile_loadd(4, w, w_bytes);
    _tile_stream_loadd(5, v, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_stream_loadd(6, v + 512, 64);
    _tile_dpbf16ps(1, 4, 6);
    if (four) {
        _tile_stream_loadd(7, v + 1024, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_stream_loadd(5, v + 1536, 64);
        _tile_dpbf16ps(3, 4, 5);
    }
}

/* C tiles 0-3 to and from sums [16][64] (tile t: columns 16t .. 16t + 15). */
static inline void store_sum_tiles(float *sums) {
    _tile_stored(0, sums, 256); _tile_stored(1, sums + 16, 256);
    _tile_stored(2, sums + 32, 256); _tile_stored(3, sums + 48, 256);
}

static inline void load_sum_tiles(const float *sums) {
    _tile_loadd(0, sums, 256); _tile_loadd(1, sums + 16, 256);
    _tile_loadd(2, sums + 32, 256); _tile_loadd(3, sums + 48, 256);
}


/* scores [16][width] = scale * Q K^T for the chunks of 16 positions below `visible` (the first
 * `rows` rows scaled): the prefill's scores, and the decode cascade's over a shared prefix, so
 * that both give a token the same bits. With D = 64 the two query tiles stay loaded and two
 * chunks run at once (independent sums). Key tiles load with the streaming hint, as
 * amx_weighted_values loads value tiles: a query tile reads each once (a head's keys and
 * values are 128 KiB at 512 positions, more than L1), and loaded plainly they evicted the
 * score and weight rows the softmax works on (prompts of 256 to 768 tokens, alone or after
 * cached positions: 7-13% faster). With beside, that tile's softmax meanwhile. */
static inline void amx_scaled_scores(const uint16_t *qbuf, const uint32_t *kt, int64_t dim,
                                     int64_t rows, int64_t visible, float scale, int64_t width,
                                     float *scores, softmax_rows_t *beside) {
    const int64_t k_steps = dim / 32, chunks = (visible + 15) / 16;
    int64_t c = 0;
    if (k_steps == 2) {
        _tile_loadd(4, qbuf, dim * 2);
        _tile_loadd(5, qbuf + 32, dim * 2);
        for (; c + 1 < chunks; c += 2) {
            const uint32_t *b = kt + c * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_stream_loadd(6, b, 64);
            _tile_stream_loadd(2, b + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 2);
            _tile_stream_loadd(7, b + 256, 64);
            _tile_stream_loadd(3, b + 768, 64);
            _tile_dpbf16ps(0, 5, 7);
            _tile_dpbf16ps(1, 5, 3);
            softmax_upto(beside, 16 * (c + 2) / chunks);
            _tile_stored(0, scores + c * 16, width * 4);
            _tile_stored(1, scores + c * 16 + 16, width * 4);
        }
    }
    for (; c < chunks; c++) {
        _tile_zero(0);
        for (int64_t k = 0; k < k_steps; k++) {
            _tile_loadd(4, qbuf + 32 * k, dim * 2);
            _tile_stream_loadd(6, kt + (c * k_steps + k) * 256, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
        softmax_upto(beside, 16 * (c + 1) / chunks);
        _tile_stored(0, scores + c * 16, width * 4);
    }
    softmax_upto(beside, 16);
    const __m512 scale_v = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < visible; p += 16)
            _mm512_storeu_ps(scores + r * width + p, _mm512_mul_ps(_mm512_loadu_ps(scores + r * width + p), scale_v));
}

/* O = P V over layout_head's value tiles, for dims [d0, d0 + 64) (32 when not `four`), into
 * sums [16][64]; v0 at d0's tile. With beside, that tile's softmax meanwhile. */
static inline void amx_values_from_tiles(const uint16_t *probs, int64_t width, const uint16_t *v0,
                                         int64_t dim, int64_t visible, int four, float *sums,
                                         softmax_rows_t *beside) {
    const int64_t chunks = (visible + 31) / 32;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t c = 0; c < chunks; c++) {
        amx_weighted_values(probs + 32 * c, width * 2, v0 + c * (dim / 16) * 512, four);
        softmax_upto(beside, 16 * (c + 1) / chunks);
    }
    softmax_upto(beside, 16);
    store_sum_tiles(sums);
}
#endif

/* rows[i] lane j -> rows[j] lane i: a 16 x 16 transpose of 32-bit elements in four rounds of
 * shuffles (within 32 bits, 64 bits, then 128-bit lanes twice). */
static inline void transpose_16x16(__m512i rows[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  /* rows[4i + m]: in 128-bit lane L, column 4L + m of rows 4i.. */
        rows[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        rows[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        rows[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        rows[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        const __m512i a0 = _mm512_shuffle_i32x4(rows[m], rows[4 + m], 0x88);
        const __m512i a1 = _mm512_shuffle_i32x4(rows[m], rows[4 + m], 0xdd);
        const __m512i b0 = _mm512_shuffle_i32x4(rows[8 + m], rows[12 + m], 0x88);
        const __m512i b1 = _mm512_shuffle_i32x4(rows[8 + m], rows[12 + m], 0xdd);
        t[m] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        t[4 + m] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        t[8 + m] = _mm512_shuffle_i32x4(a0, b0, 0xdd);
        t[12 + m] = _mm512_shuffle_i32x4(a1, b1, 0xdd);
    }
    for (int i = 0; i < 16; i++) rows[i] = t[i];
}

/* The two products without AMX, from the same layouts: a k-pair of the K^T tiles is 16
 * positions' (d, d+1) and one of the V tiles 16 dims' (p, p+1), as vdpbf16ps takes them.
 * Register tiles of 4 query rows x NC outputs of 16 (NC <= 4). */
static inline __attribute__((always_inline)) void vnni_tile(
        const uint16_t *a, int64_t a_stride, int64_t pairs, const uint16_t *b, int64_t b_step,
        int64_t b_pair, int64_t b_group, const int NC, float *c, int64_t c_stride) {
    __m512 acc[6][4];
    vnni_tile_sums(a, a_stride, 4, pairs, b, b_step, b_pair, b_group, NC, acc, (prefetch_t){NULL, 0});
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < NC; j++) _mm512_storeu_ps(c + r * c_stride + 16 * j, acc[r][j]);
}

/* c[16 rows][outs x 16] = a[rows][pairs] x b, for the first `rows` rows (by 4s: rows past
 * them are zeros in a, and their sums are never read). */
static inline void vnni_product(const uint16_t *a, int64_t a_stride, int64_t rows, int64_t pairs,
                                const uint16_t *b, int64_t b_step, int64_t b_pair, int64_t b_group,
                                int64_t outs, float *c, int64_t c_stride) {
    for (int64_t r = 0; r < rows; r += 4)
        for (int64_t j = 0; j < outs; j += 4) {
            const uint16_t *ar = a + r * a_stride, *bj = b + j * b_step;
            float *cr = c + r * c_stride + 16 * j;
            switch (outs - j < 4 ? outs - j : 4) {
            case 1: vnni_tile(ar, a_stride, pairs, bj, b_step, b_pair, b_group, 1, cr, c_stride); break;
            case 2: vnni_tile(ar, a_stride, pairs, bj, b_step, b_pair, b_group, 2, cr, c_stride); break;
            case 3: vnni_tile(ar, a_stride, pairs, bj, b_step, b_pair, b_group, 3, cr, c_stride); break;
            default: vnni_tile(ar, a_stride, pairs, bj, b_step, b_pair, b_group, 4, cr, c_stride); break;
            }
        }
}
#endif
#endif

/* Prefill attention over the paged cache, bf16, on AMX tiles (AVX512-BF16 register tiles on
 * CPUs without AMX): the new tokens of each sequence (a prompt, or a chunk of one after cached
 * positions) attend causally to everything before.
 *
 * Why: torch's SDPA needs the sequence's keys and values gathered out of the blocks, a boolean
 * mask when positions are cached, and one call per sequence; it took 18% of a 768-token prompt's
 * prefill and 44% of a prefix-cached one's here. On tiles, a 16 x 16 block of (query, key)
 * scores is two tile products and a block of outputs four, all rows of every tile in use.
 * Without AMX, SDPA ran at ~85 GFLOP/s on a 512-token prompt (3.6 ms a layer, 45% of the
 * prefill on an AMD EPYC, Zen 5); the register tiles read the same layouts.
 *
 * Per (sequence, KV head) the keys are first laid out as B tiles of K^T (16 dim-pairs x 16
 * positions) and the values as B tiles of 32 positions in pairs x 16 dims; every query tile of
 * that head (16 new tokens of one query head) then multiplies them: S = Q K^T in fp32, scaled,
 * masked past each token's own position, softmax in fp32, the probabilities rounded to bf16
 * (as GPU flash attention rounds them), O = P V in fp32, divided by the fp32 sums, rounded to
 * bf16 once. A token's result depends only on its sequence, not on the rest of the batch, and
 * is the bits a decode step gives it: without AMX the register tiles sum as the decode kernels
 * do (prefix_scores, vnni_product), and with AMX decode tokens run on tiles too (decode_amx.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "decode_tiles.h"
#include "kernels.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

/* Bytes of one (sequence, KV head)'s key and value tiles for `len` positions. */
size_t head_tile_bytes(int64_t len, int64_t dim) {
    return (size_t)(key_tile_bytes(len, dim) + round_up(len, 32) * dim * 2);
}

/* Keys [0, len) of head h as K^T tiles [len/16][D/32][16 pairs][16 positions] (32-bit pairs),
 * and values as [len/32][D/16][16 position pairs][16 dims][2]; past len, zeros. Only positions
 * [p_lo, p_hi) (p_lo a multiple of 32; p_hi past round_up(len, 32) means up to there), so that
 * several threads can share one head. */
void layout_head(const uint16_t *k_cache, const uint16_t *v_cache, span_t s, int64_t h,
                 uint8_t *tiles, int64_t p_lo, int64_t p_hi) {
    const int64_t k_steps = s.dim / 32, chunks16 = round_up(s.len, 16) / 16;
    uint32_t *kt = (uint32_t *)tiles;
    uint16_t *vp = (uint16_t *)(tiles + key_tile_bytes(s.len, s.dim));
    p_hi = p_hi < round_up(s.len, 32) ? p_hi : round_up(s.len, 32);
    for (int64_t p0 = p_lo; p0 < p_hi && p0 < chunks16 * 16; p0 += 16) {
        /* the keys and values two chunks ahead (and the first two): the blocks are scattered,
         * and the loads below otherwise wait on memory one by one */
        for (int64_t p = p0 == p_lo ? p0 : p0 + 32; p < p0 + 48 && p < s.len; p++) {
            const int64_t at = kv_offset(s.table, p, s.block_size, s.num_kv_heads, h, s.dim);
            for (int64_t b = 0; b < s.dim * 2; b += 64) {
                _mm_prefetch((const char *)(k_cache + at) + b, _MM_HINT_T0);
                _mm_prefetch((const char *)(v_cache + at) + b, _MM_HINT_T0);
            }
        }
        for (int64_t k = 0; k < k_steps; k++) {  /* 16 positions x 16 pairs, transposed */
            __m512i rows[16];
            for (int64_t i = 0; i < 16; i++)
                rows[i] = p0 + i < s.len
                    ? _mm512_loadu_si512(k_cache + kv_offset(s.table, p0 + i, s.block_size, s.num_kv_heads, h, s.dim) + 32 * k)
                    : _mm512_setzero_si512();
            transpose_16x16(rows);
            for (int64_t j = 0; j < 16; j++)
                _mm512_storeu_si512(kt + (p0 / 16 * k_steps + k) * 256 + j * 16, rows[j]);
        }
    }
    for (int64_t p0 = p_lo; p0 < p_hi; p0 += 32)
        pair_values(v_cache, s, h, p0, 0, s.dim, vp + p0 / 32 * (s.dim / 16) * 512);
}

/* scores [16][width] = scale * Q K^T for the tile's rows and the positions below `visible`. On
 * AMX tiles their own order; else summed as decode attention sums them (prefix_scores), so that
 * a token gets the same scores whether it comes in a prompt's chunk, alone as a decode step, or
 * as a speculative draft. With beside, another tile's softmax meanwhile (done by the return). */
static void query_scores(const uint16_t *qbuf, const uint32_t *kt, int64_t dim, int64_t rows,
                         int64_t visible, float scale, int64_t width, float *scores, int amx,
                         softmax_rows_t *beside) {
#if defined(__AMX_BF16__)
    if (amx) {
        amx_scaled_scores(qbuf, kt, dim, rows, visible, scale, width, scores, beside);
        return;
    }
#endif
    (void)amx;
    prefix_scores(qbuf, round_up(rows, 4), kt, round_up(visible, 16), dim, scale, scores, width);
    softmax_upto(beside, 16);
}

/* Scratch of one query tile: the queries [16][D] bf16, scores [16][len] fp32, probabilities
 * [16][len] bf16 (len rounded up to 32), a pass's outputs [16][64] fp32, the row sums. */
static size_t tile_scratch_bytes(int64_t max_len, int64_t dim) {
    return (size_t)(16 * dim * 2 + 16 * round_up(max_len, 32) * 6 + 16 * 64 * 4 + 64);
}

/* Rows [t0, t0 + 16) of query head `qh` of a sequence (its first new token at position context,
 * its row in q at q0) against its KV head's tiles (span s, head s.h0), in scratch of its own. */
typedef struct {
    span_t s;
    const uint8_t *tiles;
    uint16_t *qbuf;
    float *sums;
    int64_t q0, t0, qh, rows, visible, width;
    softmax_rows_t softmax;
} query_tile_t;

static query_tile_t query_tile(span_t s, const uint8_t *tiles, int64_t q0, int64_t q_len,
                               int64_t t0, int64_t qh, uint8_t *scratch) {
    query_tile_t t = {.s = s, .tiles = tiles, .q0 = q0, .t0 = t0, .qh = qh};
    const int64_t context = s.len - q_len;
    t.rows = q_len - t0 < 16 ? q_len - t0 : 16;
    t.visible = context + t0 + t.rows;  /* the last row's */
    t.width = round_up(t.visible, 32);
    t.qbuf = (uint16_t *)scratch;
    float *scores = (float *)(t.qbuf + 16 * s.dim);
    uint16_t *probs = (uint16_t *)(scores + 16 * t.width);
    t.sums = (float *)(probs + 16 * t.width);
    t.softmax = (softmax_rows_t){scores, t.sums + 16 * 64, probs, t.width, t.rows, context + t0 + 1, 0};
    return t;
}

/* The tile's scores, with `beside` another tile's softmax meanwhile. */
static void tile_scores(query_tile_t *t, const uint16_t *q, int64_t q_stride, float scale, int amx,
                        softmax_rows_t *beside) {
    const int64_t dim = t->s.dim;
    for (int64_t r = 0; r < 16; r++) {  /* rows past the chunk's end: zeros, never stored */
        if (r < t->rows) memcpy(t->qbuf + r * dim, q + (t->q0 + t->t0 + r) * q_stride + t->qh * dim, (size_t)dim * 2);
        else memset(t->qbuf + r * dim, 0, (size_t)dim * 2);
    }
    query_scores(t->qbuf, (const uint32_t *)t->tiles, dim, t->rows, t->visible, scale, t->width,
                 t->softmax.scores, amx, beside);
}

/* The tile's outputs (its softmax finished first, where no other tile's products ran it), with
 * `beside` another tile's softmax meanwhile. */
static void tile_outputs(query_tile_t *t, uint16_t *out, int64_t num_heads, int amx,
                         softmax_rows_t *beside) {
    const int64_t dim = t->s.dim;
    const uint16_t *vp = (const uint16_t *)(t->tiles + key_tile_bytes(t->s.len, dim));
    softmax_upto(&t->softmax, 16);
    for (int64_t d0 = 0; d0 < dim; d0 += 64) {
        const int four = dim - d0 >= 64;  /* else 32 dims: two tiles */
#if defined(__AMX_BF16__)
        if (amx) amx_values_from_tiles(t->softmax.probs, t->width, vp + d0 / 16 * 512, dim, t->visible,
                                       four, t->sums, beside);
        else
#endif
            vnni_product(t->softmax.probs, t->width, t->rows, round_up(t->visible, 32) / 2,
                         vp + d0 / 16 * 512, 512, 32, dim / 16 * 512, four ? 4 : 2, t->sums, 64);
        softmax_upto(beside, 16);
        for (int64_t r = 0; r < t->rows; r++)
            store_divided(t->sums + r * 64, four ? 64 : 32, t->softmax.total[r],
                          out + (t->q0 + t->t0 + r) * num_heads * dim + t->qh * dim + d0);
    }
}

/* Two query tiles of a thread in turn (b may be NULL): a's softmax runs beside b's score
 * products and b's beside a's output products, on AVX512 while the AMX tiles multiply (each
 * tile's own sums as before). */
static void query_pair(query_tile_t *a, query_tile_t *b, const uint16_t *q, int64_t q_stride,
                       float scale, uint16_t *out, int64_t num_heads, int amx) {
    tile_scores(a, q, q_stride, scale, amx, NULL);
    if (b) tile_scores(b, q, q_stride, scale, amx, &a->softmax);
    tile_outputs(a, out, num_heads, amx, b ? &b->softmax : NULL);
    if (b) tile_outputs(b, out, num_heads, amx, NULL);
}

int prefill_attention_fits(int64_t dim) { return dim % 32 == 0 && dim <= 256; }

/* For each listed sequence b = seqs[i]: its new tokens are rows query_start_loc[b] ..
 * query_start_loc[b + 1] of q (token stride q_stride elements, heads contiguous), positions
 * seq_lens[b] - q_len .. seq_lens[b] - 1 of a [blocks, block_size, Hkv, D] cache whose blocks
 * are block_tables[b * table_stride + ...]; results go to the same rows of out [N, Hq, D].
 * block_size a power of two. Returns 0, -1 when out of memory, or -2 when prefill_attention_fits
 * says no (then nothing is written). */
int paged_prefill_attention(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                            const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                            const int32_t *query_start_loc, const int32_t *seq_lens,
                            const int32_t *seqs, int64_t num_seqs, uint16_t *out, int64_t num_heads,
                            int64_t num_kv_heads, int64_t dim, int64_t block_size, float scale) {
    const int64_t group = num_heads / num_kv_heads;
    if (!prefill_attention_fits(dim)) return -2;
    const int amx = has_amx();  /* also asks Linux for the AMX state */
    size_t *offset = malloc(sizeof(size_t) * (size_t)(num_seqs * num_kv_heads + 1));
    int64_t *first_task = malloc(sizeof(int64_t) * (size_t)(num_seqs + 1));
    if (!offset || !first_task) {
        free(offset);
        free(first_task);
        return -1;
    }
    int64_t max_len = 0;
    offset[0] = 0;
    first_task[0] = 0;
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t b = seqs[i], len = seq_lens[b];
        const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
        max_len = len > max_len ? len : max_len;
        for (int64_t h = 0; h < num_kv_heads; h++)
            offset[i * num_kv_heads + h + 1] = offset[i * num_kv_heads + h] + head_tile_bytes(len, dim);
        first_task[i + 1] = first_task[i] + num_heads * ((q_len + 15) / 16);
    }
    uint8_t *tiles = alloc_lines(offset[num_seqs * num_kv_heads] + 64);
    int failed = tiles == NULL;
    if (!failed) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_seqs * num_kv_heads; task++) {
            const int64_t b = seqs[task / num_kv_heads];
            span_t s = {block_tables + b * table_stride, seq_lens[b], 0, num_kv_heads, group,
                        num_kv_heads, dim, block_size};
            layout_head(k_cache, v_cache, s, task % num_kv_heads, tiles + offset[task], 0,
                        round_up(s.len, 32));
        }
#pragma omp parallel reduction(+ : failed)
        {
            const size_t scratch_bytes = tile_scratch_bytes(max_len, dim);
            uint8_t *scratch = alloc_lines(2 * scratch_bytes);
            failed += scratch == NULL;
            if (scratch && amx) amx_configure_tiles();
            const int64_t tasks = first_task[num_seqs];
#pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < (tasks + 1) / 2; pair++) {
                if (!scratch) continue;
                query_tile_t tile[2];
                for (int64_t k = 0; k < 2 && 2 * pair + k < tasks; k++) {
                    const int64_t task = 2 * pair + k;
                    int64_t i = 0;
                    while (first_task[i + 1] <= task) i++;
                    const int64_t b = seqs[i], local = task - first_task[i];
                    const int64_t qh = local % num_heads, t0 = local / num_heads * 16, h = qh / group;
                    const int64_t q0 = query_start_loc[b], q_len = query_start_loc[b + 1] - q0;
                    const span_t s = {block_tables + b * table_stride, seq_lens[b], h, h + 1, group,
                                      num_kv_heads, dim, block_size};
                    tile[k] = query_tile(s, tiles + offset[i * num_kv_heads + h], q0, q_len, t0, qh,
                                         scratch + k * scratch_bytes);
                }
                query_pair(&tile[0], 2 * pair + 1 < tasks ? &tile[1] : NULL, q, q_stride, scale, out,
                           num_heads, amx);
            }
            if (scratch && amx) amx_release_tiles();
            free(scratch);
        }
    }
    free(tiles);
    free(offset);
    free(first_task);
    return failed ? -1 : 0;
}
#else
int prefill_attention_fits(int64_t dim) { (void)dim; return 0; }
int paged_prefill_attention(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                            const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                            const int32_t *query_start_loc, const int32_t *seq_lens,
                            const int32_t *seqs, int64_t num_seqs, uint16_t *out, int64_t num_heads,
                            int64_t num_kv_heads, int64_t dim, int64_t block_size, float scale) {
    (void)q; (void)q_stride; (void)k_cache; (void)v_cache; (void)block_tables; (void)table_stride;
    (void)query_start_loc; (void)seq_lens; (void)seqs; (void)num_seqs; (void)out; (void)num_heads;
    (void)num_kv_heads; (void)dim; (void)block_size; (void)scale;
    return -2;
}
#endif

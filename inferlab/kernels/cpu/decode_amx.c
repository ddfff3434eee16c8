/* bf16 decode attention on AMX tiles, for CPUs where prefill attention runs on them
 * (prefill_attention.c): a token's scores, softmax weights and outputs come out as the same bits
 * as the prefill's for the same token over the same positions. AMX sums a tile product in its
 * own order, which no AVX512 code reproduces; so when a busy batch leaves a prompt's last token
 * alone, a preempted request recomputes its outputs, or drafts are verified, a token that took
 * the other kernel would otherwise get other logits and a seeded request another sample.
 *
 * The sums are the prefill's, operand for operand: scores are Q K^T over k-steps of 32 dims in
 * order (here with the roles swapped: 16 keys are the A tile, read from the cache in place, and
 * the token's query heads of one KV head the columns of B; a tile product gives the same bits
 * either way round), scaled, softmax_numerators_ps, the weights rounded to bf16, and P V over
 * chunks of 32 positions in order with the values in layout_head's pairs, divided by the sum.
 * Tokens that share a prompt's blocks meet its positions together (attend_group), as
 * decode_prefix.c's cascade does without AMX.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "decode_tiles.h"
#include "kernels.h"

#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
#include <immintrin.h>

/* One thread's scratch for tokens of up to max_len positions: Q^T tiles (one per k-step), a C
 * tile, the value pairs of one chunk of 32 positions, and 32 rows (a tile of 16 rows read from
 * any of the first 16) of weights (bf16), scores, output sums (fp32, 64 dims) and the sums of the
 * prefix's values, one such block a pass of 64 dims. Tiles always take 16 rows (columns of
 * Q^T): those past a task's rows hold whatever they held, and as a tile product keeps rows (and
 * columns) apart, only their own results, never read, see it. */
typedef struct {
    uint16_t *qt, *pairs, *weights;
    float *tile, *sums, *prefix_sums, *scores, *total;
    int64_t width;  /* positions a weight and score row has room for */
} amx_scratch_t;

#define SCRATCH_ROWS 32

static int64_t scratch_bytes(int64_t max_len, int64_t dim) {
    const int64_t width = round_up(max_len, 32), passes = (dim + 63) / 64;
    return dim / 32 * 1024 + 1024 + 4096
           + SCRATCH_ROWS * (width * 2 + width * 4 + 64 * 4 * (1 + passes) + 4);
}

static int scratch_init(amx_scratch_t *w, int64_t max_len, int64_t dim) {
    uint8_t *at = alloc_lines((size_t)scratch_bytes(max_len, dim));
    if (!at) return -1;
    w->width = round_up(max_len, 32);
    w->qt = (uint16_t *)at;
    w->tile = (float *)(at + dim / 32 * 1024);
    w->pairs = (uint16_t *)(w->tile + 256);
    w->weights = w->pairs + 2048;
    w->scores = (float *)(w->weights + SCRATCH_ROWS * w->width);
    w->sums = w->scores + SCRATCH_ROWS * w->width;
    w->prefix_sums = w->sums + SCRATCH_ROWS * 64;
    w->total = w->prefix_sums + SCRATCH_ROWS * 64 * ((dim + 63) / 64);
    return 0;
}

/* Columns [c0, c0 + n) of the B tiles of Q^T from n query heads (rows D apart): k-step k's row
 * d holds each head's dims 32k + 2d, 32k + 2d + 1 side by side. */
static void query_columns(const uint16_t *q, int64_t n, int64_t dim, int64_t c0, uint16_t *qt) {
    for (int64_t k = 0; k < dim / 32; k++)
        for (int64_t d = 0; d < 16; d++)
            for (int64_t j = 0; j < n; j++)
                memcpy(qt + k * 512 + d * 32 + 2 * (c0 + j), q + j * dim + 32 * k + 2 * d, 4);
}

/* Chunk p0's scores out of its C tile, stored at tile ([16 positions][16 columns]): column j to
 * row row0 + j, scaled. */
static inline void spread_scores(const float *tile, int64_t n, float scale, int64_t p0, int64_t row0,
                                 amx_scratch_t *w) {
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t j = 0; j < n; j++)
        _mm512_storeu_ps(w->scores + (row0 + j) * w->width + p0,
                         _mm512_mul_ps(_mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32((int)j)), tile, 4),
                                       _mm512_set1_ps(scale)));
}

/* C tile T = the chunk's 16 keys (rows `keys`) times the columns of Q^T, k-step by k-step. A
 * macro: tile numbers must be constants. */
#define CHUNK_SCORES(T)                                                                         \
    do {                                                                                        \
        _tile_zero(T);                                                                          \
        for (int64_t k = 0; k < k_steps; k++) {                                                 \
            if (s.block_size >= 16) _tile_loadd(4, keys[0] + 32 * k, row_bytes);               \
            else { /* a chunk spans blocks: its rows copied side by side */                     \
                for (int i = 0; i < 16; i++) memcpy(gathered + 32 * i, keys[i] + 32 * k, 64);   \
                _tile_loadd(4, gathered, 64);                                                   \
            }                                                                                   \
            _tile_loadd(6, w->qt + k * 512, 64);                                                \
            _tile_dpbf16ps(T, 4, 6);                                                            \
        }                                                                                       \
    } while (0)

/* scores[row0 + j][p] = scale * q_j . k_p for the n columns of Q^T and positions [p_lo, p_hi)
 * (p_lo a multiple of 16) of KV head s.h0. Chunks alternate between C tiles 0 and 1, and a
 * chunk's tile is stored and spread out after the next chunk's products are issued, so that
 * those run while it is. */
static void amx_scores(const uint16_t *k_cache, span_t s, float scale, int64_t n, int64_t p_lo,
                       int64_t p_hi, int64_t row0, amx_scratch_t *w) {
    const int64_t k_steps = s.dim / 32, row_bytes = s.num_kv_heads * s.dim * 2;
    uint16_t gathered[16 * 32] __attribute__((aligned(64)));
    span_t upto = s;
    upto.len = p_hi;  /* chunk_rows' view: rows past p_hi repeat its first */
    for (int64_t p0 = p_lo; p0 < p_hi; p0 += 16) {
        const uint16_t *keys[16];
        chunk_rows(k_cache, upto, p0, keys, 0);
        if ((p0 - p_lo) & 16) {
            CHUNK_SCORES(1);
            _tile_stored(0, w->tile, 64);
        } else {
            CHUNK_SCORES(0);
            if (p0 == p_lo) continue;
            _tile_stored(1, w->tile, 64);
        }
        spread_scores(w->tile, n, scale, p0 - 16, row0, w);
    }
    if (p_hi > p_lo) {  /* the last chunk's tile */
        const int64_t last = p_lo + (p_hi - p_lo - 1) / 16 * 16;
        if ((last - p_lo) & 16) _tile_stored(1, w->tile, 64);
        else _tile_stored(0, w->tile, 64);
        spread_scores(w->tile, n, scale, last, row0, w);
    }
}

/* C tiles 0-3 (dims d0 .. d0 + 63; 0-1 and 32 dims when not `four`) += the weight rows [row0,
 * row0 + 16) times the values of positions [p_lo, p_hi) (p_lo a multiple of 32) of KV head
 * s.h0, chunk by chunk in order, each chunk paired as layout_head pairs it. The value rows of
 * a chunk are scattered over blocks as the keys are, so the next chunk's are prefetched as
 * chunk_rows prefetches keys (64 tokens of ~300 positions, a whole engine step: 52.5-53.9 ->
 * 51.7-52.0 ms). */
static void amx_values(const uint16_t *v_cache, span_t s, int64_t d0, int four, int64_t p_lo,
                       int64_t p_hi, int64_t row0, amx_scratch_t *w) {
    span_t upto = s;
    upto.len = p_hi;
    for (int64_t p0 = p_lo; p0 < p_hi; p0 += 32) {
        prefetch_two_chunks(v_cache, upto, p0 + 32);  /* the next 32 rows, asked for once */
        pair_values(v_cache, upto, s.h0, p0, d0, four ? 64 : 32, w->pairs);
        amx_weighted_values(w->weights + row0 * w->width + p0, w->width * 2, w->pairs, four);
    }
}

/* The prefix's scores for the rows of a group (row i * n + j: token first + i's query head
 * h * group + g0 + j), scaled, at w->scores: the prefill's product (amx_scaled_scores), 16 query
 * rows against the prefix's key tiles, every row of a C tile stored in place. */
static void prefix_rows_scores(const uint16_t *q, int64_t q_stride, const int32_t *rows,
                               int64_t first, int64_t count, span_t s, int64_t h, int64_t g0,
                               int64_t n, const uint8_t *tiles, int64_t shared, float scale,
                               amx_scratch_t *w) {
    uint16_t *qbuf = w->qt;  /* [16][D]: Q^T's room, before the tokens' own columns take it */
    for (int64_t i = 0; i < count; i++)
        memcpy(qbuf + i * n * s.dim, q + rows[first + i] * q_stride + (h * s.group + g0) * s.dim,
               sizeof(uint16_t) * (size_t)(n * s.dim));
    amx_scaled_scores(qbuf, (const uint32_t *)tiles, s.dim, count * n, shared, scale, w->width,
                      w->scores, NULL);
}

/* Tokens [first, first + count) of decode_amx's list, query heads [g0, g0 + n) of KV head h
 * (count * n <= 16), whose first `shared` positions (a multiple of 32) are the same blocks,
 * laid out once in `tiles` (this head's): those positions' scores and weighted values as one
 * tile product for all the tokens' heads, each token's own positions after them alone. The sums
 * go the per-token way (shared 0, count 1), so a token's result does not depend on its company:
 * the prefix's value sums are the C tiles a lone token holds after its first shared / 32
 * chunks, and carry on from there. */
static void attend_group(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                         const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                         const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                         int64_t first, int64_t count, span_t s, int64_t h, int64_t g0, int64_t n,
                         const uint8_t *tiles, int64_t shared, float scale, amx_scratch_t *w,
                         uint16_t *out) {
    span_t token[16];
    for (int64_t i = 0; i < count; i++) {
        token[i] = s;
        token[i].table = block_tables + seqs[first + i] * table_stride;
        token[i].len = seq_lens[seqs[first + i]];
        token[i].h0 = h;
        token[i].h1 = h + 1;
    }
    if (shared)
        prefix_rows_scores(q, q_stride, rows, first, count, s, h, g0, n, tiles, shared, scale, w);
    for (int64_t i = 0; i < count; i++) {
        query_columns(q + rows[first + i] * q_stride + (h * s.group + g0) * s.dim, n, s.dim, 0, w->qt);
        amx_scores(k_cache, token[i], scale, n, shared, token[i].len, i * n, w);
        for (int64_t r = i * n; r < (i + 1) * n; r++)
            w->total[r] = softmax_numerators_ps(w->scores + r * w->width, token[i].len,
                                                w->weights + r * w->width, round_up(token[i].len, 32));
    }
    const uint16_t *prefix_values = shared ? (const uint16_t *)(tiles + key_tile_bytes(shared, s.dim)) : NULL;
    for (int64_t d0 = 0, pass = 0; d0 < s.dim; d0 += 64, pass++) {
        const int four = s.dim - d0 >= 64;
        float *prefix = w->prefix_sums + pass * SCRATCH_ROWS * 64;
        amx_values_from_tiles(w->weights, w->width, prefix_values + d0 / 16 * 512, s.dim, shared,
                              four, prefix, NULL);
        for (int64_t i = 0; i < count; i++) {
            load_sum_tiles(prefix + i * n * 64);
            amx_values(v_cache, token[i], d0, four, shared, token[i].len, i * n, w);
            store_sum_tiles(w->sums);
            uint16_t *o = out + rows[first + i] * s.num_kv_heads * s.group * s.dim + (h * s.group + g0) * s.dim;
            for (int64_t j = 0; j < n; j++)
                store_divided(w->sums + j * 64, four ? 64 : 32, w->total[i * n + j], o + j * s.dim + d0);
        }
    }
}

/* paged_decode_attention's tokens on AMX tiles. A task is one KV head (a band of 16 of its
 * query heads, when it has more) of one token, or, when the batch's sequences share their first
 * blocks (at least PREFIX_MIN_POSITIONS positions) and tokens are enough to keep the threads
 * busy, of as many tokens as their heads fill a tile's 16 columns. Returns 0, or -1 when
 * scratch memory could not be allocated. */
int decode_amx(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache, const uint16_t *v_cache,
               const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
               const int32_t *rows, const int32_t *seqs, int64_t num_decodes, uint16_t *out,
               span_t s, float scale) {
    const int64_t bands = (s.group + 15) / 16, band = s.group < 16 ? s.group : 16;
    int64_t shared = num_decodes >= 2 * omp_get_max_threads() && s.group <= 8
        ? shared_prefix(block_tables, table_stride, seq_lens, seqs, num_decodes, s.block_size) / 32 * 32 : 0;
    shared = shared >= PREFIX_MIN_POSITIONS ? shared : 0;
    const int64_t per_task = shared ? 16 / s.group : 1;
    const int64_t groups = (num_decodes + per_task - 1) / per_task, per_group = s.num_kv_heads * bands;
    /* a group's KV heads on one thread in turn, when there are groups enough to share out: a
     * cache row holds every head's positions side by side, so the lines the hardware
     * prefetchers bring in around one head's are the next head's (a decode step of 64 tokens
     * of ~300 positions: attention 39 -> 35 ms; one head a claim, the threads took turns) */
    const int per_claim = groups >= 4 * omp_get_max_threads() ? (int)per_group : 1;
    const int64_t tile_bytes = shared ? prefix_tile_bytes(shared, s.dim) : 0;
    uint8_t *tiles = shared ? alloc_lines((size_t)(s.num_kv_heads * tile_bytes)) : NULL;
    if (shared && !tiles) return -1;
    span_t prefix = s;
    prefix.table = block_tables + seqs[0] * table_stride;
    prefix.len = shared;
    int failed = 0;
#pragma omp parallel reduction(+ : failed)
    {
        if (shared) layout_prefix(k_cache, v_cache, prefix, tiles);
        amx_scratch_t w = {0};
        const int ok = scratch_init(&w, s.len, s.dim) == 0;
        failed += !ok;
        if (ok) amx_configure_tiles();
#pragma omp for schedule(dynamic, per_claim)
        for (int64_t task = 0; task < groups * per_group; task++) {
            if (!ok) continue;
            const int64_t first = task / per_group * per_task;
            const int64_t h = task / bands % s.num_kv_heads, g0 = task % bands * 16;
            const int64_t count = num_decodes - first < per_task ? num_decodes - first : per_task;
            attend_group(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens, rows,
                         seqs, first, count, s, h, g0, s.group - g0 < band ? s.group - g0 : band,
                         shared ? tiles + h * tile_bytes : NULL, shared, scale, &w, out);
        }
        if (ok) amx_release_tiles();
        free(w.qt);
    }
    free(tiles);
    return failed ? -1 : 0;
}
#endif

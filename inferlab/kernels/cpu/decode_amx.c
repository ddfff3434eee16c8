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
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_tiles.h"
#include "kernels.h"

#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
#include <immintrin.h>

/* One thread's scratch for tokens of up to max_len positions: Q^T tiles (one per k-step), a C
 * tile, the 64-dim output sums, the value pairs of one chunk of 32 positions, 16 weight rows
 * (bf16), the scores of those rows and their sums. Tiles always take 16 rows (columns of Q^T):
 * those past a KV head's query heads hold whatever they held, and as a tile product keeps rows
 * (and columns) apart, only their own results, never read, see it. */
typedef struct {
    uint16_t *qt, *pairs, *weights;
    float *tile, *sums, *scores, *total;
    int64_t width;  /* positions a weight and score row has room for */
} amx_scratch_t;

static int64_t scratch_bytes(int64_t max_len, int64_t dim) {
    const int64_t width = round_up(max_len, 32);
    return dim / 32 * 1024 + 1024 + 16 * 64 * 4 + 4096 + 16 * width * 2 + 16 * width * 4 + 64;
}

static int scratch_init(amx_scratch_t *w, int64_t max_len, int64_t dim) {
    uint8_t *at = aligned_alloc(64, (size_t)round_up(scratch_bytes(max_len, dim), 64));
    if (!at) return -1;
    w->width = round_up(max_len, 32);
    w->qt = (uint16_t *)at;
    w->tile = (float *)(at + dim / 32 * 1024);
    w->sums = w->tile + 256;
    w->pairs = (uint16_t *)(w->sums + 16 * 64);
    w->weights = w->pairs + 2048;
    w->scores = (float *)(w->weights + 16 * w->width);
    w->total = w->scores + 16 * w->width;
    return 0;
}

/* B tiles of Q^T for n query heads (rows D apart): k-step k's row d holds each head's dims
 * 32k + 2d, 32k + 2d + 1 side by side. */
static void query_columns(const uint16_t *q, int64_t n, int64_t dim, uint16_t *qt) {
    for (int64_t k = 0; k < dim / 32; k++)
        for (int64_t d = 0; d < 16; d++)
            for (int64_t j = 0; j < n; j++)
                memcpy(qt + k * 512 + d * 32 + 2 * j, q + j * dim + 32 * k + 2 * d, 4);
}

/* scores[j][p] = scale * q_j . k_p for the n heads and positions [0, s.len) of KV head s.h0. */
static void amx_scores(const uint16_t *k_cache, span_t s, float scale, int64_t n,
                       amx_scratch_t *w) {
    const int64_t k_steps = s.dim / 32, row_bytes = s.num_kv_heads * s.dim * 2;
    uint16_t gathered[16 * 32] __attribute__((aligned(64)));
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
        const uint16_t *keys[16];
        chunk_rows(k_cache, s, p0, keys);
        _tile_zero(0);
        for (int64_t k = 0; k < k_steps; k++) {
            if (s.block_size >= 16) _tile_loadd(4, keys[0] + 32 * k, row_bytes);
            else {  /* a chunk spans blocks: its rows copied side by side */
                for (int i = 0; i < 16; i++) memcpy(gathered + 32 * i, keys[i] + 32 * k, 64);
                _tile_loadd(4, gathered, 64);
            }
            _tile_loadd(6, w->qt + k * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
        _tile_stored(0, w->tile, 64);  /* [16 positions][16 heads] */
        for (int64_t j = 0; j < n; j++)
            _mm512_storeu_ps(w->scores + j * w->width + p0,
                             _mm512_mul_ps(_mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32((int)j)),
                                                               w->tile, 4), _mm512_set1_ps(scale)));
    }
}

/* out rows [n][D] (bf16, D apart) = the weights times the values of KV head s.h0, divided by
 * the rows' sums; a chunk's values are paired as layout_head pairs them, 64 dims at a time. */
static void amx_values(const uint16_t *v_cache, span_t s, int64_t n, amx_scratch_t *w,
                       uint16_t *out) {
    for (int64_t d0 = 0; d0 < s.dim; d0 += 64) {
        const int four = s.dim - d0 >= 64;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t p0 = 0; p0 < s.len; p0 += 32) {
            pair_values(v_cache, s, s.h0, p0, d0, four ? 64 : 32, w->pairs);
            _tile_loadd(4, w->weights + p0, w->width * 2);
            _tile_loadd(5, w->pairs, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, w->pairs + 512, 64);
            _tile_dpbf16ps(1, 4, 6);
            if (four) {
                _tile_loadd(7, w->pairs + 1024, 64);
                _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, w->pairs + 1536, 64);
                _tile_dpbf16ps(3, 4, 5);
            }
        }
        _tile_stored(0, w->sums, 256); _tile_stored(1, w->sums + 16, 256);
        _tile_stored(2, w->sums + 32, 256); _tile_stored(3, w->sums + 48, 256);
        for (int64_t j = 0; j < n; j++) {
            const __m512 inv = _mm512_set1_ps(1.0f / w->total[j]);
            for (int64_t d = 0; d < (four ? 64 : 32); d += 16)
                store_bf16(out + j * s.dim + d0 + d, _mm512_mul_ps(_mm512_loadu_ps(w->sums + j * 64 + d), inv));
        }
    }
}

/* One decode token's query heads of KV heads [s.h0, s.h1), 16 heads at a time; q and out
 * point at the token's rows [Hq, D]. */
static void attend_amx(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                       span_t s, float scale, amx_scratch_t *w, uint16_t *out) {
    for (int64_t h = s.h0; h < s.h1; h++)
        for (int64_t g0 = 0; g0 < s.group; g0 += 16) {
            const int64_t n = s.group - g0 < 16 ? s.group - g0 : 16, first = (h * s.group + g0) * s.dim;
            span_t head = s;
            head.h0 = h;
            head.h1 = h + 1;
            query_columns(q + first, n, s.dim, w->qt);
            amx_scores(k_cache, head, scale, n, w);
            for (int64_t j = 0; j < n; j++) {
                float *row = w->scores + j * w->width;
                w->total[j] = softmax_numerators_ps(row, s.len);
                for (int64_t p = 0; p < round_up(s.len, 32); p += 16) {
                    const __mmask16 live = p + 16 <= s.len ? 0xffff : p < s.len ? (__mmask16)((1u << (s.len - p)) - 1) : 0;
                    store_bf16(w->weights + j * w->width + p, _mm512_maskz_loadu_ps(live, row + p));
                }
            }
            amx_values(v_cache, head, n, w, out + first);
        }
}

/* paged_decode_attention's tokens on AMX tiles, a task per (token, KV heads). Returns 0, or -1
 * when scratch memory could not be allocated. */
int decode_amx(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache, const uint16_t *v_cache,
               const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
               const int32_t *rows, const int32_t *seqs, int64_t num_decodes, uint16_t *out,
               span_t s, int64_t heads_per_task, float scale) {
    const int64_t tasks_per_token = s.num_kv_heads / heads_per_task;
    int failed = 0;
#pragma omp parallel reduction(+ : failed)
    {
        amx_scratch_t w = {0};
        const int ok = scratch_init(&w, s.len, s.dim) == 0;
        failed += !ok;
        if (ok) amx_configure_tiles();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_decodes * tasks_per_token; task++) {
            if (!ok) continue;
            const int64_t i = task / tasks_per_token, h0 = task % tasks_per_token * heads_per_task;
            span_t token = s;
            token.table = block_tables + seqs[i] * table_stride;
            token.len = seq_lens[seqs[i]];
            token.h0 = h0;
            token.h1 = h0 + heads_per_task;
            attend_amx(q + rows[i] * q_stride, k_cache, v_cache, token, scale, &w,
                       out + rows[i] * s.num_kv_heads * s.group * s.dim);
        }
        if (ok) free(w.qt);
    }
    return failed ? -1 : 0;
}
#endif

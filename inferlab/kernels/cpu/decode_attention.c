/* Decode attention straight from the paged KV cache (paged_decode_attention): each decode
 * token's query against its sequence's cached positions, read block by block where they lie,
 * no gather. Generic fp32/bf16 loops, and AVX512-BF16 score and value kernels (decode_tiles.h):
 * fp32 scores and softmax, the weights rounded to bf16 for the values (as prefill_attention.c
 * and GPU flash attention round them), fp32 sums. See paged_decode_attention for how work is
 * split.
 *
 * Why C: torch's path gathered each sequence's K/V out of the blocks and ran SDPA per
 * sequence; here one call covers the batch (inferlab/kernels/cpu_ops.py builds and calls it).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_tiles.h"
#include "kernels.h"

/* The shortest shared prefix decode_with_prefix takes: below it, laying out the prefix's tiles
 * costs about what sharing them saves. */
#define PREFIX_MIN_POSITIONS 64

/* bf16 with a head dim the AVX512-BF16 kernels take (a multiple of 32, at most 256). */
static inline int bf16_kernels_fit(int elem, int64_t dim) {
    return elem == 2 && dim % 32 == 0 && dim <= 256;
}

/* Floats between rows of scores: the bf16 weights written over them in place (weights_to_pairs)
 * take round_up(len, 32) positions' room. */
static inline int64_t row_floats(int64_t len) { return round_up(len, 32); }

/* scores[r*stride + p] = scale * q_r . k_p, in fp32 from either dtype, one KV head at a time. */
static inline __attribute__((always_inline)) void scores_any(
        const char *q, const char *k_cache, span_t s, float scale, int elem, float *scores,
        int64_t stride, float *qf, float *kv) {
    for (int64_t h = s.h0; h < s.h1; h++) {
        int64_t r0 = (h - s.h0) * s.group;
        load_f32(q + h * s.group * s.dim * elem, elem, qf, s.group * s.dim);
        for (int64_t i = 0; i < s.group * s.dim; i++) qf[i] *= scale;
        for (int64_t p = 0; p < s.len; p++) {
            load_f32(k_cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, h, s.dim) * elem,
                     elem, kv, s.dim);
            for (int64_t g = 0; g < s.group; g++) {
                float dot = 0.0f;
                const float *qg = qf + g * s.dim;
#pragma omp simd reduction(+ : dot)
                for (int64_t i = 0; i < s.dim; i++) dot += qg[i] * kv[i];
                scores[(r0 + g) * stride + p] = dot;
            }
        }
    }
}

/* acc[r] = sum_p w[r*stride + p] * v_p in fp32, from either dtype, one KV head at a time. */
static inline __attribute__((always_inline)) void values_any(
        const char *v_cache, span_t s, int elem, const float *w, int64_t stride, float *acc,
        float *kv) {
    int64_t rows = (s.h1 - s.h0) * s.group;
    memset(acc, 0, (size_t)rows * s.dim * sizeof(float));
    for (int64_t h = s.h0; h < s.h1; h++)
        for (int64_t p = 0; p < s.len; p++) {
            load_f32(v_cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, h, s.dim) * elem,
                     elem, kv, s.dim);
            for (int64_t g = 0; g < s.group; g++) {
                int64_t r = (h - s.h0) * s.group + g;
                float wp = w[r * stride + p], *ar = acc + r * s.dim;
#pragma omp simd
                for (int64_t i = 0; i < s.dim; i++) ar[i] += wp * kv[i];
            }
        }
}

/* Softmax numerators in place (scores already scaled, rows stride floats apart) for rows
 * [r0, r1); sums to total[r]. */
static inline __attribute__((always_inline)) void softmax_rows(
        float *scores, int64_t r0, int64_t r1, int64_t len, int64_t stride, float *total) {
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
}

#ifdef __AVX512BF16__
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
        for (int64_t g = 0; g < s.group; g++) {
            float *x = w.acc + (h * w.head_rows + g) * s.dim, inv = 1.0f / w.total[h * w.head_rows + g];
            reorder_pairs(x, s.dim, 0);
            for (int64_t i = 0; i < s.dim; i++) x[i] *= inv;
            store_f32(x, 2, out + ((s.h0 + h) * s.group + g) * s.dim, s.dim);
        }
}

/* One bf16 decode token by the whole team: every thread of the enclosing parallel region calls
 * it. The keys are split by chunks of 16 positions, the softmax by query rows, the values by
 * (KV head, 32 dims). For batches too small to give each thread KV heads of its own (one token
 * of a model with 3 KV heads on 2 threads: one thread read two heads' K and V, the other one).
 * Every score, row sum and output element goes through the same operations in the same order
 * as in attend, so a token's result does not depend on the path it took. scores [rows *
 * row_floats(len)], acc [rows * D] and total [rows] are shared; out is the token's row [Hq, D]. */
static inline __attribute__((always_inline)) void attend_together(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, span_t s,
        float scale, float *scores, float *acc, float *total, uint16_t *out) {
    const int64_t heads = s.h1 - s.h0, rows = heads * s.group, units = s.dim / 32;
    const int64_t chunks = (s.len + 15) / 16, t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p_lo = chunks * t / T * 16, p_hi = chunks * (t + 1) / T * 16;
    const int64_t task_lo = heads * units * t / T, task_hi = heads * units * (t + 1) / T;
    const int64_t stride = row_floats(s.len), r_lo = rows * t / T, r_hi = rows * (t + 1) / T;
    span_t mine = s;  /* the KV heads of this thread's value tasks */
    mine.h0 = s.h0 + task_lo / units;
    mine.h1 = s.h0 + (task_hi + units - 1) / units;
    prefetch_two_chunks(k_cache, s, p_lo);
    prefetch_two_chunks(v_cache, mine, 0);
    scores_bf16(q, k_cache, s, scale, scores, stride, s.group, p_lo, p_hi < s.len ? p_hi : s.len);
#pragma omp barrier
    softmax_rows(scores, r_lo, r_hi, s.len, stride, total);
    for (int64_t r = r_lo; r < r_hi; r++) weights_to_pairs(scores + r * stride, s.len);
#pragma omp barrier
    for (int64_t task = task_lo; task < task_hi; task++) {
        const int64_t h = task / units, u = task % units;
        span_t head = s;
        head.h0 = s.h0 + h;
        head.h1 = head.h0 + 1;
        float *ar = acc + h * s.group * s.dim + 32 * u;
        for (int64_t g = 0; g < s.group; g++) memset(ar + g * s.dim, 0, 32 * sizeof(float));
        for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
            const uint16_t *v[16];
            int n = chunk_rows(v_cache, head, p0, v);
            for (int i = 0; i < 16; i++) v[i] += 32 * u;
            for (int64_t g0 = 0; g0 < s.group;)
                g0 += values_rows(v, n, (const uint32_t *)scores + (h * s.group + g0) * stride + p0 / 2,
                                  stride, ar + g0 * s.dim, s.dim, s.group - g0, 2);
        }
        for (int64_t g = 0; g < s.group; g++) {
            const int64_t r = h * s.group + g;
            float inv = 1.0f / total[r], *x = ar + g * s.dim;
            reorder_pairs(x, 32, 0);
            for (int i = 0; i < 32; i++) x[i] *= inv;
            store_f32(x, 2, out + (s.h0 * s.group + r) * s.dim + 32 * u, 32);
        }
    }
#pragma omp barrier  /* the next token's scores overwrite this one's */
}

/* attend_together with the common head dims as constants (see attend_specialized). */
static void attend_together_specialized(const uint16_t *q, const uint16_t *k_cache,
                                        const uint16_t *v_cache, span_t s, float scale,
                                        float *scores, float *acc, float *total, uint16_t *out) {
    if (s.dim == 64) { s.dim = 64; attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out); }
    else if (s.dim == 128) { s.dim = 128; attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out); }
    else attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out);
}
#endif

/* Floats of scratch attend needs for `rows` query rows over len positions. */
static inline int64_t attend_scratch_floats(int64_t rows, int64_t len, int64_t dim) {
    return rows * (row_floats(len) + dim + 1) + dim;
}

/* One decode token against its sequence's paged cache, for the query heads of KV heads
 * [s.h0, s.h1); out points at the token's output row [Hq, D]. */
static inline __attribute__((always_inline)) void attend(
        const char *q, const char *k_cache, const char *v_cache, span_t s, float scale, int elem,
        float *scratch, char *out) {
    const int64_t rows = (s.h1 - s.h0) * s.group, stride = row_floats(s.len);
    float *scores = scratch, *acc = scores + rows * stride, *kv = acc + rows * s.dim;
    float *total = kv + s.dim;
#ifdef __AVX512BF16__
    if (bf16_kernels_fit(elem, s.dim)) {
        rows_t w = {scores, acc, total, stride, s.group};
        attend_weights((const uint16_t *)q, (const uint16_t *)k_cache, (const uint16_t *)v_cache,
                       s, scale, 0, w);
        attend_values((const uint16_t *)v_cache, s, 0, w, (uint16_t *)out);
        return;
    }
#endif
    scores_any(q, k_cache, s, scale, elem, scores, stride, acc, kv);
    softmax_rows(scores, 0, rows, s.len, stride, total);
    values_any(v_cache, s, elem, scores, stride, acc, kv);
    for (int64_t r = 0; r < rows; r++) {
        float inv = 1.0f / total[r], *ar = acc + r * s.dim;
        for (int64_t i = 0; i < s.dim; i++) ar[i] *= inv;
        store_f32(ar, elem, out + (s.h0 * s.group + r) * s.dim * elem, s.dim);
    }
}

/* attend with the common head dims and dtypes as constants, so its short inner loops are
 * fully unrolled (a 64-wide loop with a runtime trip count spends more on its set-up than on
 * its four vector iterations). */
static void attend_specialized(const char *q, const char *k_cache, const char *v_cache,
                               span_t s, float scale, int elem, float *scratch, char *out) {
    if (s.dim == 64 && elem == 2) { s.dim = 64; attend(q, k_cache, v_cache, s, scale, 2, scratch, out); }
    else if (s.dim == 128 && elem == 2) { s.dim = 128; attend(q, k_cache, v_cache, s, scale, 2, scratch, out); }
    else if (s.dim == 64 && elem == 4) { s.dim = 64; attend(q, k_cache, v_cache, s, scale, 4, scratch, out); }
    else if (s.dim == 128 && elem == 4) { s.dim = 128; attend(q, k_cache, v_cache, s, scale, 4, scratch, out); }
    else attend(q, k_cache, v_cache, s, scale, elem, scratch, out);
}

#ifdef __AVX512BF16__
/* paged_decode_attention's tokens one after another, each by the whole team (attend_together);
 * s: every field but the table, len the longest sequence's. */
static int decode_together(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads, span_t s, float scale) {
    const int64_t query_rows = s.num_kv_heads * s.group, stride = row_floats(s.len);
    float *scores = malloc(sizeof(float) * (size_t)(query_rows * (stride + s.dim + 1)));
    if (!scores) return -1;
    float *acc = scores + query_rows * stride, *total = acc + query_rows * s.dim;
#pragma omp parallel
    for (int64_t i = 0; i < num_decodes; i++) {
        span_t token = s;
        token.table = block_tables + seqs[i] * table_stride;
        token.len = seq_lens[seqs[i]];
        attend_together_specialized((const uint16_t *)q + rows[i] * q_stride, k_cache, v_cache,
                                    token, scale, scores, acc, total,
                                    (uint16_t *)out + rows[i] * num_heads * s.dim);
    }
    free(scores);
    return 0;
}
#endif

#ifdef __AVX512BF16__
/* attend_weights, or attend_values (`values`), with the common head dims as constants. */
static void attend_part(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                        span_t s, float scale, int64_t from, rows_t w, uint16_t *out, int values) {
    if (values && s.dim == 64) { s.dim = 64; attend_values(v_cache, s, from, w, out); }
    else if (values && s.dim == 128) { s.dim = 128; attend_values(v_cache, s, from, w, out); }
    else if (values) attend_values(v_cache, s, from, w, out);
    else if (s.dim == 64) { s.dim = 64; attend_weights(q, k_cache, v_cache, s, scale, from, w); }
    else if (s.dim == 128) { s.dim = 128; attend_weights(q, k_cache, v_cache, s, scale, from, w); }
    else attend_weights(q, k_cache, v_cache, s, scale, from, w);
}

/* Positions every listed sequence holds in the same blocks (a shared system prompt, n copies
 * of one prompt), a multiple of 16 and at most every sequence's length. */
static int64_t shared_prefix(const int32_t *block_tables, int64_t table_stride,
                             const int32_t *seq_lens, const int32_t *seqs, int64_t num_decodes,
                             int64_t block_size) {
    int64_t blocks = seq_lens[seqs[0]] / block_size;
    const int32_t *first = block_tables + seqs[0] * table_stride;
    for (int64_t i = 1; i < num_decodes && blocks > 0; i++) {
        const int32_t *table = block_tables + seqs[i] * table_stride;
        int64_t same = 0;
        while (same < blocks && same < seq_lens[seqs[i]] / block_size && table[same] == first[same])
            same++;
        blocks = same;
    }
    return blocks * block_size / 16 * 16;
}

/* The shared prefix's scores for `rows` query rows (a multiple of 4, bf16, D apart). */
static void prefix_scores(const uint16_t *qbuf, int64_t rows, const uint32_t *kt, int64_t shared,
                          int64_t dim, float scale, float *scores, int64_t stride) {
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

/* Decode tokens whose sequences share their first `shared` positions' blocks ("cascade"
 * attention): the prefix's keys and values are laid out once per KV head (prefill's tiles),
 * and the query rows of PREFIX_GROUP tokens at a time meet them as matrix products instead of
 * each token reading the prefix on its own. A group's scores stay in its thread's scratch
 * (the whole batch's, 2 MB a layer for 64 tokens of the embedded model, fell out of L2 and
 * cost what the products saved). The products sum in the per-token kernels' order
 * (prefix_scores_tile; vnni_product's chains are values_tile's), and each token then carries
 * on from `shared` as attend does, so its result is the same bits as alone. */
#define PREFIX_GROUP 4  /* tokens a task: 8 left the two threads unevenly loaded (4% slower), 2 wasted tile rows */
#define PREFIX_LAYOUT_POSITIONS 128  /* a task of laying out the prefix (a multiple of 32) */

/* The scratch floats of one group: query rows (bf16), scores, sums and totals, by KV head. */
static int64_t group_scratch_floats(span_t s) {
    const int64_t rows = s.num_kv_heads * round_up(PREFIX_GROUP * s.group, 4);
    return rows * (s.dim / 2 + row_floats(s.len) + s.dim + 1);
}

/* Tokens [first, first + count) of paged_decode_attention's list (rows, seqs) against the
 * prefix's tiles (tile_bytes a KV head) and then their own positions. Rows by KV head: row
 * i * group + g of head h is token first + i's query head h * group + g. s: every field but
 * the table, len the longest sequence's. */
static void prefix_group(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                         const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                         const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                         int64_t first, int64_t count, uint16_t *out, const uint8_t *tiles,
                         int64_t tile_bytes, span_t s, int64_t shared, float scale, float *scratch) {
    const int64_t H = s.num_kv_heads, dim = s.dim, stride = row_floats(s.len);
    const int64_t rows_h = round_up(PREFIX_GROUP * s.group, 4), live = count * s.group;
    uint16_t *qbuf = (uint16_t *)scratch;
    float *scores = scratch + H * rows_h * dim / 2, *acc = scores + H * rows_h * stride;
    float *total = acc + H * rows_h * dim;
    memset(qbuf, 0, sizeof(uint16_t) * (size_t)(H * rows_h * dim));  /* rows past `live`: zeros */
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < count; i++)
            memcpy(qbuf + (h * rows_h + i * s.group) * dim, q + rows[first + i] * q_stride + h * s.group * dim,
                   sizeof(uint16_t) * (size_t)(s.group * dim));
    for (int64_t h = 0; h < H; h++)
        prefix_scores(qbuf + h * rows_h * dim, round_up(live, 4), (const uint32_t *)(tiles + h * tile_bytes),
                      shared, dim, scale, scores + h * rows_h * stride, stride);
    for (int values = 0; values < 2; values++) {
        if (values)  /* the prefix's sums, then each token's own positions' */
            for (int64_t h = 0; h < H; h++) {
                const uint16_t *vp = (const uint16_t *)(tiles + h * tile_bytes + round_up(shared, 16) * dim * 2);
                float *ah = acc + h * rows_h * dim;
                vnni_product((const uint16_t *)(scores + h * rows_h * stride), stride * 2, live,
                             shared / 2, vp, 512, 32, dim / 16 * 512, dim / 16, ah, dim);
                for (int64_t r = 0; r < live; r++) reorder_pairs(ah + r * dim, dim, 1);
            }
        for (int64_t i = 0; i < count; i++) {
            span_t token = s;
            token.table = block_tables + seqs[first + i] * table_stride;
            token.len = seq_lens[seqs[first + i]];
            rows_t w = {scores + i * s.group * stride, acc + i * s.group * dim, total + i * s.group,
                        stride, rows_h};
            attend_part(q + rows[first + i] * q_stride, k_cache, v_cache, token, scale, shared, w,
                        out + rows[first + i] * H * s.group * dim, values);
        }
    }
}

/* decode_with_prefix: the prefix's tiles once per KV head, then groups of tokens as tasks.
 * Returns 0, or -1 out of memory. */
static int decode_with_prefix(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                              const uint16_t *v_cache, const int32_t *block_tables,
                              int64_t table_stride, const int32_t *seq_lens, const int32_t *rows,
                              const int32_t *seqs, int64_t num_decodes, uint16_t *out, span_t s,
                              int64_t shared, float scale) {
    const int64_t tile_bytes = round_up((int64_t)head_tile_bytes(shared, s.dim), 64);
    uint8_t *tiles = aligned_alloc(64, (size_t)(s.num_kv_heads * tile_bytes));
    if (!tiles) return -1;
    span_t prefix = s;
    prefix.table = block_tables + seqs[0] * table_stride;
    prefix.len = shared;
    int failed = 0;
#pragma omp parallel reduction(+ : failed)
    {
        const int64_t parts = (shared + PREFIX_LAYOUT_POSITIONS - 1) / PREFIX_LAYOUT_POSITIONS;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.num_kv_heads * parts; task++) {
            const int64_t h = task / parts, p_lo = task % parts * PREFIX_LAYOUT_POSITIONS;
            layout_head(k_cache, v_cache, prefix, h, tiles + h * tile_bytes, p_lo,
                        p_lo + PREFIX_LAYOUT_POSITIONS);
        }
        float *scratch = malloc(sizeof(float) * (size_t)group_scratch_floats(s));
        failed += scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t first = 0; first < num_decodes; first += PREFIX_GROUP)
            if (scratch)
                prefix_group(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                             rows, seqs, first, num_decodes - first < PREFIX_GROUP ? num_decodes - first : PREFIX_GROUP,
                             out, tiles, tile_bytes, s, shared, scale, scratch);
        free(scratch);
    }
    free(tiles);
    return failed ? -1 : 0;
}
#endif

/* Decode attention straight from the paged cache, no gather: token rows[i] (query at
 * q + rows[i]*q_stride, heads contiguous) attends to the first seq_lens[seqs[i]] positions of
 * sequence seqs[i], whose blocks are block_tables[seqs[i]*table_stride + ...]. Caches are
 * [blocks, block_size, Hkv, D]; out is [N, Hq, D]. A task is one token with all its KV heads
 * when there are enough tokens to keep the threads busy (each block then read front to back),
 * else one (token, KV head); with fewer (token, KV head) pairs than twice the threads (a single
 * stream), bf16 tokens go one at a time through the whole team (decode_together). Every head's
 * arithmetic is the same either way, so a token's result does not depend on what else is in
 * the batch. Returns 0, or -1 if scratch memory could not be allocated (the work it would have
 * done is then missing). */
int paged_decode_attention(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads,
                           int64_t num_kv_heads, int64_t dim, int64_t block_size, float scale,
                           int elem) {
    int64_t group = num_heads / num_kv_heads, max_len = 0, failed = 0;
    for (int64_t i = 0; i < num_decodes; i++)
        max_len = seq_lens[seqs[i]] > max_len ? seq_lens[seqs[i]] : max_len;
    int64_t heads_per_task = num_decodes >= 2 * omp_get_max_threads() ? num_kv_heads : 1;
    int64_t tasks_per_token = num_kv_heads / heads_per_task;
#ifdef __AVX512BF16__
    /* too few (token, KV head) tasks to keep every thread busy: the team takes a token at a time */
    if (num_decodes * num_kv_heads < 2 * omp_get_max_threads() && omp_get_max_threads() > 1
        && bf16_kernels_fit(elem, dim)) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_together(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                               rows, seqs, num_decodes, out, num_heads, s, scale);
    }
    /* tokens enough to share the work of a prefix (and a prefix worth sharing): cascade */
    const int64_t shared = num_decodes >= 2 * omp_get_max_threads() && bf16_kernels_fit(elem, dim)
        ? shared_prefix(block_tables, table_stride, seq_lens, seqs, num_decodes, block_size) : 0;
    if (shared >= PREFIX_MIN_POSITIONS) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_with_prefix(q, q_stride, k_cache, v_cache, block_tables, table_stride,
                                  seq_lens, rows, seqs, num_decodes, out, s, shared, scale);
    }
#endif
    const size_t scratch_floats = (size_t)attend_scratch_floats(heads_per_task * group, max_len, dim);
#pragma omp parallel reduction(+ : failed)
    {
        float *scratch = malloc(sizeof(float) * scratch_floats);  /* one per thread */
        failed += scratch == NULL;
        /* every thread takes part in the loop (its barrier), a thread without scratch idly */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_decodes * tasks_per_token; task++) {
            if (!scratch) continue;
            int64_t i = task / tasks_per_token, h0 = task % tasks_per_token * heads_per_task;
            span_t s = {block_tables + seqs[i] * table_stride, seq_lens[seqs[i]], h0,
                        h0 + heads_per_task, group, num_kv_heads, dim, block_size};
            attend_specialized((const char *)q + rows[i] * q_stride * elem, k_cache, v_cache, s,
                               scale, elem, scratch, (char *)out + rows[i] * num_heads * dim * elem);
        }
        free(scratch);
    }
    return failed ? -1 : 0;
}

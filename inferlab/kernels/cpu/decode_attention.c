/* Decode attention straight from the paged KV cache (paged_decode_attention): each decode
 * token's query against its sequence's cached positions, read block by block where they lie,
 * no gather. Generic fp32/bf16 loops, and AVX512-BF16 score and value kernels (decode_tiles.h):
 * fp32 scores and softmax, the weights rounded to bf16 for the values (as prefill_attention.c
 * and GPU flash attention round them), fp32 sums. On CPUs with AMX, bf16 tokens go to
 * decode_amx.c instead, whose sums are the AMX prefill's. See paged_decode_attention for how
 * work is split.
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

/* bf16 with a head dim the AVX512-BF16 kernels take (a multiple of 32, at most 256). */
static inline int bf16_kernels_fit(int elem, int64_t dim) {
    return elem == 2 && dim % 32 == 0 && dim <= 256;
}

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

#ifdef __AVX512BF16__
/* One bf16 decode token by the whole team: every thread of the enclosing parallel region calls
 * it. The keys are split by chunks of 16 positions, the softmax by query rows, the values by
 * (KV head, 32 dims). For batches too small to give each thread KV heads of its own (one token
 * of a model with 3 KV heads on 2 threads: one thread read two heads' K and V, the other one).
 * Every score, row sum and output element goes through the same operations in the same order
 * as in attend, so a token's result does not depend on the path it took. scores [rows *
 * row_floats(len)], acc [rows * D] and total [rows] are shared; out is the token's row [Hq, D];
 * `more`: another token follows, whose scores overwrite these, so the team waits for it. */
static inline __attribute__((always_inline)) void attend_together(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, span_t s,
        float scale, float *scores, float *acc, float *total, uint16_t *out, int more) {
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
            int n = chunk_rows(v_cache, head, p0, v, 1);
            for (int i = 0; i < 16; i++) v[i] += 32 * u;
            for (int64_t g0 = 0; g0 < s.group;)
                g0 += values_rows(v, n, (const uint32_t *)scores + (h * s.group + g0) * stride + p0 / 2,
                                  stride, ar + g0 * s.dim, s.dim, s.group - g0, 2);
        }
        for (int64_t g = 0; g < s.group; g++)
            store_row(ar + g * s.dim, 32, total[h * s.group + g],
                      out + (s.h0 * s.group + h * s.group + g) * s.dim + 32 * u);
    }
    if (more) {
#pragma omp barrier  /* the next token's scores overwrite this one's */
    }
}

/* attend_together with the common head dims as constants (see attend_specialized). */
static void attend_together_specialized(const uint16_t *q, const uint16_t *k_cache,
                                        const uint16_t *v_cache, span_t s, float scale,
                                        float *scores, float *acc, float *total, uint16_t *out,
                                        int more) {
    if (s.dim == 64) { s.dim = 64; attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out, more); }
    else if (s.dim == 128) { s.dim = 128; attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out, more); }
    else attend_together(q, k_cache, v_cache, s, scale, scores, acc, total, out, more);
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
/* decode_together's scratch on the stack up to this many floats (9 query rows of up to ~380
 * positions), and no barrier after the last token (the region's end is one): a one-token call
 * from the caches took 2.3 -> 2.0 us at 64 positions, 3.85 -> 3.5 at 200 (AMD EPYC), of which
 * a decode step makes one a layer */
#define TOGETHER_STACK_FLOATS 4096

/* paged_decode_attention's tokens one after another, each by the whole team (attend_together);
 * s: every field but the table, len the longest sequence's. */
static int decode_together(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads, span_t s, float scale) {
    const int64_t query_rows = s.num_kv_heads * s.group, stride = row_floats(s.len);
    const int64_t floats = query_rows * (stride + s.dim + 1);
    float stack_scratch[TOGETHER_STACK_FLOATS] __attribute__((aligned(64)));
    float *scores = floats <= TOGETHER_STACK_FLOATS ? stack_scratch
                                                    : alloc_lines(sizeof(float) * (size_t)floats);
    if (!scores) return -1;
    float *acc = scores + query_rows * stride, *total = acc + query_rows * s.dim;
#pragma omp parallel
    for (int64_t i = 0; i < num_decodes; i++) {
        span_t token = s;
        token.table = block_tables + seqs[i] * table_stride;
        token.len = seq_lens[seqs[i]];
        attend_together_specialized((const uint16_t *)q + rows[i] * q_stride, k_cache, v_cache,
                                    token, scale, scores, acc, total,
                                    (uint16_t *)out + rows[i] * num_heads * s.dim, i + 1 < num_decodes);
    }
    if (scores != stack_scratch) free(scores);
    return 0;
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
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    /* where prefill attention runs on AMX tiles, decode tokens must too (decode_amx.c) */
    if (bf16_kernels_fit(elem, dim) && has_amx()) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_amx(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens, rows,
                          seqs, num_decodes, out, s, scale);
    }
#endif
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
        float *scratch = alloc_lines(sizeof(float) * scratch_floats);  /* one per thread */
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

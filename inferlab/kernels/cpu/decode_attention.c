/* Decode attention straight from the paged KV cache (paged_decode_attention): each decode
 * token's query against its sequence's cached positions, read block by block where they lie,
 * no gather. Generic fp32/bf16 loops, AVX512-BF16 score and value kernels (decode_tiles.h),
 * and AMX tiles for the bf16 scores where the CPU has them; see paged_decode_attention for how
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

/* bf16 with a head dim the AVX512-BF16 and AMX kernels take (a multiple of 32, at most 256). */
static inline int bf16_kernels_fit(int elem, int64_t dim) {
    return elem == 2 && dim % 32 == 0 && dim <= 256;
}

/* Floats of one band of scores_amx's scores: 16 lanes a position, len rounded up to 16. */
static inline int64_t band_floats(int64_t len) { return (len + 15) / 16 * 256; }

/* Floats of scores a span needs: bands of 16 lanes on AMX, else rows. */
static inline int64_t score_floats(int64_t heads, int64_t group, int64_t len, int amx) {
    return amx ? (heads + 16 / group - 1) / (16 / group) * band_floats(len) : heads * group * len;
}

/* scores[r*len + p] = scale * q_r . k_p, in fp32 from either dtype, one KV head at a time. */
static inline __attribute__((always_inline)) void scores_any(
        const char *q, const char *k_cache, span_t s, float scale, int elem, float *scores,
        float *qf, float *kv) {
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
                scores[(r0 + g) * s.len + p] = dot;
            }
        }
    }
}

/* acc[r] = sum_p w[r*len + p] * v_p in fp32, from either dtype, one KV head at a time. */
static inline __attribute__((always_inline)) void values_any(
        const char *v_cache, span_t s, int elem, const float *w, float *acc, float *kv) {
    int64_t rows = (s.h1 - s.h0) * s.group;
    memset(acc, 0, (size_t)rows * s.dim * sizeof(float));
    for (int64_t h = s.h0; h < s.h1; h++)
        for (int64_t p = 0; p < s.len; p++) {
            load_f32(v_cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, h, s.dim) * elem,
                     elem, kv, s.dim);
            for (int64_t g = 0; g < s.group; g++) {
                int64_t r = (h - s.h0) * s.group + g;
                float wp = w[r * s.len + p], *ar = acc + r * s.dim;
#pragma omp simd
                for (int64_t i = 0; i < s.dim; i++) ar[i] += wp * kv[i];
            }
        }
}

/* The rows layout's softmax numerators in place (scores already scaled) for rows [r0, r1);
 * sums to total[r]. */
static inline __attribute__((always_inline)) void softmax_rows(float *scores, int64_t r0,
                                                               int64_t r1, int64_t len, float *total) {
    for (int64_t r = r0; r < r1; r++) {
        float *sr = scores + r * len, top = -INFINITY, sum = 0.0f;
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

#ifdef __AVX512BF16__  /* the whole-team path (attend_together) and the AMX score kernels */

/* One bf16 decode token by the whole team: every thread of the enclosing parallel region calls
 * it. The keys are split by chunks of 16 positions, the softmax by query rows, the values by
 * (KV head, 32 dims). For batches too small to give each thread KV heads of its own (one token
 * of a model with 3 KV heads on 2 threads: one thread read two heads' K and V, the other one).
 * Every score, row sum and output element goes through the same operations in the same order
 * as in attend, so a token's result does not depend on the path it took. scores [rows * len],
 * acc [rows * D] and total [rows] are shared; out is the token's row [Hq, D]. */
static inline __attribute__((always_inline)) void attend_together(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, span_t s,
        float scale, float *scores, float *acc, float *total, uint16_t *out) {
    const int64_t heads = s.h1 - s.h0, rows = heads * s.group, units = s.dim / 32;
    const int64_t chunks = (s.len + 15) / 16, t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p_lo = chunks * t / T * 16, p_hi = chunks * (t + 1) / T * 16;
    const int64_t task_lo = heads * units * t / T, task_hi = heads * units * (t + 1) / T;
    span_t mine = s;  /* the KV heads of this thread's value tasks */
    mine.h0 = s.h0 + task_lo / units;
    mine.h1 = s.h0 + (task_hi + units - 1) / units;
    prefetch_two_chunks(k_cache, s, p_lo);
    prefetch_two_chunks(v_cache, mine, 0);
    scores_bf16(q, k_cache, s, scale, scores, p_lo, p_hi < s.len ? p_hi : s.len);
#pragma omp barrier
    softmax_rows(scores, rows * t / T, rows * (t + 1) / T, s.len, total);
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
                g0 += values_rows(v, n, scores + (h * s.group + g0) * s.len + p0, s.len, 1,
                                  ar + g0 * s.dim, s.dim, s.group - g0, 2);
        }
        for (int64_t g = 0; g < s.group; g++) {
            const int64_t r = h * s.group + g;
            float inv = 1.0f / total[r], *x = ar + g * s.dim;
            interleave_pairs(x, 32);
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

#if defined(__AMX_BF16__)
/* Unscaled scores on AMX tiles, S^T = K Q^T for a chunk of 16 positions and up to 16 query
 * rows: the heads of the range in bands of 16 / group (see weights_layout), each band one C tile.
 * The A tiles are the chunk's keys loaded straight from the cache (16 rows Hkv * D apart: one
 * block, blocks being a multiple of 16 positions), 32 dims at a time across the band's heads;
 * the B tiles hold the query rows in VNNI pairs as columns, a head's rows only beside its own
 * dims (zeros elsewhere add exact zeros, so a row's sum does not depend on the band around it).
 * The C tile is stored as it is: row p, lane (head in band, g). work: (h1 - h0) * D/32 KiB. */
static void scores_amx(const uint16_t *q, const uint16_t *k_cache, span_t s, float *scores,
                       uint8_t *work) {
    const int64_t steps = s.dim / 32, heads = s.h1 - s.h0, band = 16 / s.group;
    const int64_t pos_stride = s.num_kv_heads * s.dim * 2, band_size = band_floats(s.len);
    uint32_t *q_pairs = (uint32_t *)work;  /* [heads][D/32] tiles of [16 pairs][16 lanes] */
    memset(q_pairs, 0, (size_t)(heads * s.dim * 32));
    for (int64_t h = 0; h < heads; h++)
        for (int64_t g = 0; g < s.group; g++)
            pairs_to_tile_column((const uint32_t *)(q + ((s.h0 + h) * s.group + g) * s.dim),
                                 s.dim / 2, q_pairs + h * steps * 256 + h % band * s.group + g);
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
        const uint16_t *rows[16];
        chunk_rows(k_cache, s, p0, rows);  /* and the next chunk prefetched */
        for (int64_t h = 0; h < heads; h += band) {
            const int64_t last = (h + band < heads ? h + band : heads) * steps;
            _tile_zero(0);
            for (int64_t t = h * steps; t < last; t++) {  /* head t / steps, dims 32 * (t % steps) */
                _tile_loadd(4, rows[0] + 32 * t, pos_stride);
                _tile_loadd(6, q_pairs + t * 256, 64);
                _tile_dpbf16ps(0, 4, 6);
            }
            _tile_stored(0, scores + h / band * band_size + p0 * 16, 64);
        }
    }
}

/* Softmax numerators of scores_amx's lanes in place (scaled on the way); row sums to total[r]. */
static void softmax_lanes(float *scores, span_t s, float scale, float *total) {
    const int64_t heads = s.h1 - s.h0, band = 16 / s.group, band_size = band_floats(s.len);
    const __m512 scale_v = _mm512_set1_ps(scale);
    for (int64_t h = 0; h < heads; h += band) {
        float *sc = scores + h / band * band_size;
        __m512 top = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
        for (int64_t p = 0; p < s.len; p++)
            top = _mm512_max_ps(top, _mm512_mul_ps(_mm512_loadu_ps(sc + p * 16), scale_v));
        for (int64_t p = 0; p < s.len; p++) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sc + p * 16), scale_v);
            __m512 e = exp_nonpositive_ps(_mm512_sub_ps(x, top));
            _mm512_storeu_ps(sc + p * 16, e);
            sum = _mm512_add_ps(sum, e);
        }
        const int64_t rows = ((h + band < heads ? h + band : heads) - h) * s.group;
        _mm512_mask_storeu_ps(total + h * s.group, (__mmask16)((1u << rows) - 1), sum);
    }
}
#endif

#endif

/* One decode token against its sequence's paged cache, for the query heads of KV heads
 * [s.h0, s.h1); out points at the token's output row [Hq, D]. tiles: AMX scratch, or NULL. */
static inline __attribute__((always_inline)) void attend(
        const char *q, const char *k_cache, const char *v_cache, span_t s, float scale, int elem,
        float *scratch, uint8_t *tiles, char *out) {
    const int64_t heads = s.h1 - s.h0, rows = heads * s.group;
    float *scores = scratch, *acc = scores + score_floats(heads, s.group, s.len, tiles != NULL);
    float *kv = acc + rows * s.dim, *total = kv + s.dim;
#ifdef __AVX512BF16__
    weights_layout layout = {heads, 0, s.len, 1};
    const int fast = bf16_kernels_fit(elem, s.dim);
#if defined(__AMX_BF16__)
    if (tiles) {
        scores_amx((const uint16_t *)q, (const uint16_t *)k_cache, s, scores, tiles);
        softmax_lanes(scores, s, scale, total);
        layout = (weights_layout){16 / s.group, band_floats(s.len), 1, 16};
    } else
#endif
    if (fast) {
        prefetch_two_chunks((const uint16_t *)k_cache, s, 0);
        prefetch_two_chunks((const uint16_t *)v_cache, s, 0);
        scores_bf16((const uint16_t *)q, (const uint16_t *)k_cache, s, scale, scores, 0, s.len);
        softmax_rows(scores, 0, rows, s.len, total);
    } else
#endif
    {
        scores_any(q, k_cache, s, scale, elem, scores, acc, kv);
        softmax_rows(scores, 0, rows, s.len, total);
    }
#ifdef __AVX512BF16__
    if (fast) {
        values_bf16((const uint16_t *)v_cache, s, scores, layout, acc);
        interleave_pairs(acc, rows * s.dim);
    } else
#endif
        values_any(v_cache, s, elem, scores, acc, kv);
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
                               span_t s, float scale, int elem, float *scratch, uint8_t *tiles,
                               char *out) {
    if (s.dim == 64 && elem == 2) { s.dim = 64; attend(q, k_cache, v_cache, s, scale, 2, scratch, tiles, out); }
    else if (s.dim == 128 && elem == 2) { s.dim = 128; attend(q, k_cache, v_cache, s, scale, 2, scratch, tiles, out); }
    else if (s.dim == 64 && elem == 4) { s.dim = 64; attend(q, k_cache, v_cache, s, scale, 4, scratch, NULL, out); }
    else if (s.dim == 128 && elem == 4) { s.dim = 128; attend(q, k_cache, v_cache, s, scale, 4, scratch, NULL, out); }
    else attend(q, k_cache, v_cache, s, scale, elem, scratch, tiles, out);
}

#ifdef __AVX512BF16__
/* paged_decode_attention's tokens one after another, each by the whole team (attend_together);
 * s: every field but the table, len the longest sequence's. */
static int decode_together(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads, span_t s, float scale) {
    const int64_t query_rows = s.num_kv_heads * s.group;
    float *scores = malloc(sizeof(float) * (size_t)(query_rows * (s.len + s.dim + 1)));
    if (!scores) return -1;
    float *acc = scores + query_rows * s.len, *total = acc + query_rows * s.dim;
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

/* Decode attention straight from the paged cache, no gather: token rows[i] (query at
 * q + rows[i]*q_stride, heads contiguous) attends to the first seq_lens[seqs[i]] positions of
 * sequence seqs[i], whose blocks are block_tables[seqs[i]*table_stride + ...]. Caches are
 * [blocks, block_size, Hkv, D]; out is [N, Hq, D]. A task is one token with all its KV heads
 * when there are enough tokens to keep the threads busy (each block then read front to back),
 * else one (token, KV head); with fewer (token, KV head) pairs than twice the threads (a single
 * stream), bf16 tokens go one at a time through the whole team (decode_together; not on AMX).
 * bf16 scores go through AMX tiles where the CPU has them (the choice depends on shapes, not on
 * the batch). Every head's arithmetic is the same either way, so a token's result does not
 * depend on what else is in the batch. Returns 0, or -1 if scratch memory could not be
 * allocated (the work it would have done is then missing). */
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
    int64_t tasks_per_token = num_kv_heads / heads_per_task, task_rows = heads_per_task * group;
    /* bf16 keys on AMX (scores_amx): its query tiles after the floats */
    const int amx = bf16_kernels_fit(elem, dim) && block_size % 16 == 0
                    && group <= 16 && has_amx();
#ifdef __AVX512BF16__
    /* too few (token, KV head) tasks to keep every thread busy: the team takes a token at a time
     * (AMX keeps a task per KV head: its score tiles are not split by positions here) */
    if (num_decodes * num_kv_heads < 2 * omp_get_max_threads() && omp_get_max_threads() > 1
        && !amx && bf16_kernels_fit(elem, dim)) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_together(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                               rows, seqs, num_decodes, out, num_heads, s, scale);
    }
#endif
    size_t scratch_floats = (size_t)(score_floats(heads_per_task, group, max_len, amx)
                                     + task_rows * (dim + 1) + dim);
    const size_t tile_bytes = amx ? (size_t)(heads_per_task * dim * 32) : 0;
#pragma omp parallel reduction(+ : failed)
    {
        float *scratch = malloc(sizeof(float) * scratch_floats + tile_bytes);  /* one per thread */
        uint8_t *tiles = amx && scratch ? (uint8_t *)(scratch + scratch_floats) : NULL;
        if (tiles) amx_configure_tiles();
        failed += scratch == NULL;
        /* every thread takes part in the loop (its barrier), a thread without scratch idly */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_decodes * tasks_per_token; task++) {
            if (!scratch) continue;
            int64_t i = task / tasks_per_token, h0 = task % tasks_per_token * heads_per_task;
            span_t s = {block_tables + seqs[i] * table_stride, seq_lens[seqs[i]], h0,
                        h0 + heads_per_task, group, num_kv_heads, dim, block_size};
            attend_specialized((const char *)q + rows[i] * q_stride * elem, k_cache, v_cache, s,
                               scale, elem, scratch, tiles, (char *)out + rows[i] * num_heads * dim * elem);
        }
        if (tiles) amx_release_tiles();
        free(scratch);
    }
    return failed ? -1 : 0;
}

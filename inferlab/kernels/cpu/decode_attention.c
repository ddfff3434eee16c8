/* Decode attention straight from the paged KV cache (paged_decode_attention): each decode
 * token's query against its sequence's cached positions, read block by block where they lie,
 * no gather. Generic fp32/bf16 loops, and AVX512-BF16 score and value kernels (decode_tiles.h):
 * fp32 scores and softmax, the weights rounded to bf16 for the values (as prefill_attention.c
 * and GPU flash attention round them), fp32 sums. On CPUs with AMX, bf16 tokens go to
 * decode_amx.c instead, whose sums are the AMX prefill's. See paged_decode_attention for how
 * work is split.
 *
 * fp32 on AVX2 + FMA (attend_f32, head dims a multiple of 8): the scores of 4 positions at once
 * for all of a KV head's query rows (a register tile; the lanes of the 4 dot products added by
 * one transpose of hadds), the softmax 8 positions at a time, and the values with each row's
 * sums of 32 dims in registers over 16 positions, every key and value read once for the group.
 * Against the generic loops (the committed build), one process, alternate rounds, medians of 7,
 * on a 2-core AMD EPYC (Zen 3) VM shared with other jobs (noisy; load ~1.5 for two threads, ~4.5
 * for one): paged_decode_attention on an fp32 cache of the embedded model's shape (9 / 3 heads,
 * dim 64, blocks of 16 in random order, 64 MB of caches cycled so that reads come from memory);
 * ms a call, and GB/s of K and V read:
 *
 *   batch x context   one thread: old    new          ratio   two threads: old   new          ratio
 *     1 x  128          0.060 (3.3)   0.041 (4.8)   1.46      0.062 (3.2)   0.053 (3.7)   1.18
 *     1 x  330          0.132 (3.8)   0.090 (5.6)   1.47      0.132 (3.9)   0.107 (4.8)   1.23
 *     1 x 1024          0.335 (4.7)   0.241 (6.5)   1.39      0.343 (4.6)   0.278 (5.7)   1.23
 *     8 x  128          0.371 (4.2)   0.238 (6.6)   1.56      0.245 (6.4)   0.190 (8.3)   1.29
 *     8 x  330          0.997 (4.1)   0.635 (6.4)   1.57      0.805 (5.0)   0.500 (8.1)   1.61
 *     8 x 1024          3.088 (4.1)   1.843 (6.8)   1.68      2.071 (6.1)   1.487 (8.5)   1.39
 *    64 x  128          3.349 (3.8)   1.906 (6.6)   1.76      2.031 (6.2)   1.412 (8.9)   1.44
 *    64 x  330          8.432 (3.8)   5.193 (6.2)   1.62      5.890 (5.5)   4.166 (7.8)   1.41
 *    64 x 1024         40.2   (2.5)  24.5   (4.1)   1.64     21.7   (4.6)  14.6   (6.9)   1.49
 *
 * One thread reads ~13.5 GB/s streaming here, so the new kernels are still half bound by their
 * arithmetic (~35 ns a position and KV head from cache, ~80 from memory). The engine's fp32 step
 * (benchmarks/profile_decode.py --context 320 --dtype float32, load ~1.5-1.9, old and new runs
 * alternating): batch 64, 463 / 405 ms old, 420 / 403 ms new (--steps 10); batch 1, 46.2 / 40.9
 * / 35.4 / 41.8 ms old, 43.0 / 40.2 / 36.6 / 42.1 ms new: no change beyond the noise there.
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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* fp32 with a head dim the AVX2 kernels take (a multiple of 8, at most 256). */
static inline int f32_kernels_fit(int elem, int64_t dim) {
    return elem == 4 && dim % 8 == 0 && dim <= 256;
}

/* Lane i: the sum of the 8 lanes of a_i, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)):
 * 4 dot products finished with 3 hadds and an add instead of 4 horizontal reductions. */
static inline __attribute__((always_inline)) __m128 sum_lanes_4(__m256 a0, __m256 a1, __m256 a2,
                                                                __m256 a3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Scores of R query rows (dim floats apart from q) against the 4 keys at k[i] + off:
 * scale * (q_r . k_i) to out[r * stride + i]. Each dot product's lane j sums dims j, 8 + j, ...
 * in order, then sum_lanes_4 adds the lanes: the same operations whatever R, so a row's scores
 * do not depend on how its head's rows were tiled. R * 4 sums and R query vectors: 16 ymm at
 * R = 3, each key vector loaded once for the R rows. */
static inline __attribute__((always_inline)) void scores_tile_f32(
        const float *q, const float *const k[4], int64_t off, int64_t dim, float scale,
        float *out, int64_t stride, const int R) {
    __m256 acc[3][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < dim; c += 8) {
        __m256 qv[3];
        for (int r = 0; r < R; r++) qv[r] = _mm256_loadu_ps(q + r * dim + c);
        for (int i = 0; i < 4; i++) {
            const __m256 kv = _mm256_loadu_ps(k[i] + off + c);
            for (int r = 0; r < R; r++) acc[r][i] = _mm256_fmadd_ps(qv[r], kv, acc[r][i]);
        }
    }
    for (int r = 0; r < R; r++)
        _mm_storeu_ps(out + r * stride, _mm_mul_ps(sum_lanes_4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]),
                                                   _mm_set1_ps(scale)));
}

/* Rows of the positions [p0, p0 + n) at head s.h0, into rows[0, n) (past s.len: position p0
 * again, for whole tiles whose extra results land in the row's padding and are never read). */
static inline __attribute__((always_inline)) void position_rows(const float *cache, span_t s,
                                                                int64_t p0, int n,
                                                                const float **rows) {
    for (int i = 0; i < n; i++)
        rows[i] = cache + kv_offset(s.table, p0 + i < s.len ? p0 + i : p0, s.block_size,
                                    s.num_kv_heads, s.h0, s.dim);
}

/* How far ahead (positions) scores_f32 and values_f32 ask L1 for their rows, and L2 further on:
 * the blocks are scattered, so the hardware prefetchers do not see the next one coming. One
 * thread, 64 tokens x 330 positions over blocks in random order (the embedded model, from memory,
 * 7 interleaved rounds on a busy AMD EPYC Zen 3): 176 ns a (position, KV head) without, 137 at 16
 * ahead into L1, 144 at 32; into L2 only (16, 32, 64 ahead): 149, 153, 140. Both, 8 into L1 and
 * 32 into L2 (2 threads, the 30 layers' caches, best of 9-11 alternating rounds, against 16 into
 * L1 alone): 64 tokens x 300 positions 0.84-0.94x the time, x 1000 0.87x, x 128 0.95x; 8 x 330
 * 0.91x; one token x 1000 0.91x, x 330 (from L3) 1.08x. Still 1.2-1.5x the time of a plain
 * read of the same bytes (torch's sum, 2 threads). */
#define AVX2_AHEAD 8
#define AVX2_L2_AHEAD 32

/* An ask into L1 for positions [p0, p0 + n) of the range's heads (each position's heads one
 * contiguous run), and into L2 for those AVX2_L2_AHEAD - AVX2_AHEAD after them. */
static inline __attribute__((always_inline)) void prefetch_positions(const float *cache, span_t s,
                                                                     int64_t p0, int64_t n) {
    const int64_t bytes = (s.h1 - s.h0) * s.dim * 4, l2 = AVX2_L2_AHEAD - AVX2_AHEAD;
    for (int64_t p = p0; p < p0 + n && p < s.len; p++)
        prefetch_lines(cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, s.h0, s.dim), bytes);
    for (int64_t p = p0 + l2; p < p0 + l2 + n && p < s.len; p++) {
        const char *at = (const char *)(cache + kv_offset(s.table, p, s.block_size, s.num_kv_heads, s.h0, s.dim));
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(at + b, _MM_HINT_T1);
    }
}

/* scores[(h * group + g) * stride + p] = scale * q . k_p for fp32 q (the range's rows,
 * contiguous) and K, positions [p_lo, s.len) (p_lo a multiple of 4): 4 at a time, all the range's
 * heads and each head's rows (tiles of up to 3) per read of the 4 keys. Padding up to a multiple
 * of 4 positions is written. */
static inline __attribute__((always_inline)) void scores_f32(const float *q, const float *k_cache,
                                                             span_t s, float scale, float *scores,
                                                             int64_t stride, int64_t p_lo) {
    for (int64_t p0 = p_lo; p0 < s.len; p0 += 4) {
        const float *k[4];
        position_rows(k_cache, s, p0, 4, k);
        prefetch_positions(k_cache, s, p0 + AVX2_AHEAD, 4);
        for (int64_t h = 0; h < s.h1 - s.h0; h++)
            for (int64_t g = 0; g < s.group;) {
                const int64_t r = h * s.group + g, left = s.group - g;
                const float *qr = q + (s.h0 * s.group + r) * s.dim;
                float *out = scores + r * stride + p0;
                if (left >= 3) { scores_tile_f32(qr, k, h * s.dim, s.dim, scale, out, stride, 3); g += 3; }
                else if (left == 2) { scores_tile_f32(qr, k, h * s.dim, s.dim, scale, out, stride, 2); g += 2; }
                else { scores_tile_f32(qr, k, h * s.dim, s.dim, scale, out, stride, 1); g += 1; }
            }
    }
}

/* acc rows r < R (dim floats apart) dims [0, 8 * CH) += w[r * stride + i] * v_i, for the n value
 * rows at v[i] + off: the R * CH sums stay in registers over the n positions (12 ymm at R = 3,
 * CH = 4), each value vector loaded once for the R rows, the weights broadcast. Every sum takes
 * its positions in order, whatever the tile. */
static inline __attribute__((always_inline)) void values_tile_f32(
        const float *const *v, int n, int64_t off, const float *w, int64_t stride, float *acc,
        int64_t dim, const int R, const int CH) {
    __m256 sum[3][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < CH; c++) sum[r][c] = _mm256_loadu_ps(acc + r * dim + 8 * c);
    for (int i = 0; i < n; i++) {
        __m256 wv[3];
        for (int r = 0; r < R; r++) wv[r] = _mm256_broadcast_ss(w + r * stride + i);
        for (int c = 0; c < CH; c++) {
            const __m256 x = _mm256_loadu_ps(v[i] + off + 8 * c);
            for (int r = 0; r < R; r++) sum[r][c] = _mm256_fmadd_ps(wv[r], x, sum[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < CH; c++) _mm256_storeu_ps(acc + r * dim + 8 * c, sum[r][c]);
}

/* values_tile_f32 over dims [d, d + 8 * ch) of `left` rows from acc, in tiles of up to 3 rows
 * (ch <= 4 vectors); returns the rows taken. */
static inline __attribute__((always_inline)) int64_t values_rows_f32(
        const float *const *v, int n, int64_t off, const float *w, int64_t stride, float *acc,
        int64_t dim, int64_t left, int ch) {
    const int R = left >= 3 ? 3 : (int)left;
    if (ch == 4) {
        if (R == 3) values_tile_f32(v, n, off, w, stride, acc, dim, 3, 4);
        else if (R == 2) values_tile_f32(v, n, off, w, stride, acc, dim, 2, 4);
        else values_tile_f32(v, n, off, w, stride, acc, dim, 1, 4);
    } else {  /* a head dim's last 8, 16 or 24 dims */
        for (int c = 0; c < ch; c++)
            if (R == 3) values_tile_f32(v, n, off + 8 * c, w, stride, acc + 8 * c, dim, 3, 1);
            else if (R == 2) values_tile_f32(v, n, off + 8 * c, w, stride, acc + 8 * c, dim, 2, 1);
            else values_tile_f32(v, n, off + 8 * c, w, stride, acc + 8 * c, dim, 1, 1);
    }
    return R;
}

/* acc[(h * group + g) * D + d] = sum_p w[(h * group + g) * stride + p] * v_p[d] for fp32 V:
 * 16 positions at a time, all the range's heads per chunk, each head's dims 32 at a time. */
static inline __attribute__((always_inline)) void values_f32(const float *v_cache, span_t s,
                                                             const float *w, int64_t stride,
                                                             float *acc) {
    memset(acc, 0, sizeof(float) * (size_t)((s.h1 - s.h0) * s.group * s.dim));
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
        const int n = s.len - p0 < 16 ? (int)(s.len - p0) : 16;
        const float *v[16];
        position_rows(v_cache, s, p0, n, v);
        prefetch_positions(v_cache, s, p0 + AVX2_AHEAD, 16);
        for (int64_t h = 0; h < s.h1 - s.h0; h++)
            for (int64_t d = 0; d < s.dim; d += 32) {
                const int ch = s.dim - d < 32 ? (int)(s.dim - d) / 8 : 4;
                for (int64_t g = 0; g < s.group;) {
                    const int64_t r = h * s.group + g;
                    g += values_rows_f32(v, n, h * s.dim + d, w + r * stride + p0, stride,
                                         acc + r * s.dim + d, s.dim, s.group - g, ch);
                }
            }
    }
}

/* Lanes [0, left) of 8 set (all for left >= 8), as a mask for blends. */
static inline __m256 live_lanes(int64_t left) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left < 8 ? (int)left : 8), lane));
}

/* softmax_rows for one row, 8 positions at a time: the numerators in place (zeros past len, up to
 * the next multiple of 8, inside the row's padding) and their sum, lane by lane then across. The
 * generic loops' exp is not vectorised by GCC here: it was a fifth of a one-token call. */
static inline __attribute__((always_inline)) float softmax_row_avx2(float *row, int64_t len) {
    __m256 top = _mm256_set1_ps(-INFINITY);
    for (int64_t p = 0; p < len; p += 8)
        top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(row + p),
                                                  live_lanes(len - p)));
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    half = _mm_max_ss(half, _mm_movehdup_ps(half));
    const __m256 top_v = _mm256_broadcastss_ps(half);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t p = 0; p < len; p += 8) {
        const __m256 e = _mm256_and_ps(exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + p), top_v)),
                                       live_lanes(len - p));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(row + p, e);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* attend for fp32 on AVX2 (f32_kernels_fit): the same steps, register tiles for the sums. */
static inline __attribute__((always_inline)) void attend_f32(
        const float *q, const float *k_cache, const float *v_cache, span_t s, float scale,
        float *scores, float *acc, float *total, float *out) {
    const int64_t rows = (s.h1 - s.h0) * s.group, stride = row_floats(s.len);
    scores_f32(q, k_cache, s, scale, scores, stride, 0);
    for (int64_t r = 0; r < rows; r++) total[r] = softmax_row_avx2(scores + r * stride, s.len);
    values_f32(v_cache, s, scores, stride, acc);
    for (int64_t r = 0; r < rows; r++) {
        const __m256 inv = _mm256_set1_ps(1.0f / total[r]);
        for (int64_t i = 0; i < s.dim; i += 8)
            _mm256_storeu_ps(out + (s.h0 * s.group + r) * s.dim + i,
                             _mm256_mul_ps(_mm256_loadu_ps(acc + r * s.dim + i), inv));
    }
}

/* attend_f32's values and output for KV head s.h0 + h, dims [32u, 32u + 32) (fewer at the end of
 * a head dim), all its query rows: each sum and output element as values_f32 and attend_f32
 * compute it. w: the weights (scores rows, stride apart). */
static inline __attribute__((always_inline)) void values_unit_f32(
        const float *v_cache, span_t s, int64_t h, int64_t u, const float *w, int64_t stride,
        float *acc, const float *total, float *out) {
    const int64_t d = 32 * u;
    const int ch = s.dim - d < 32 ? (int)(s.dim - d) / 8 : 4;
    span_t head = s;
    head.h0 = s.h0 + h;
    head.h1 = head.h0 + 1;
    for (int64_t g = 0; g < s.group; g++)
        memset(acc + (h * s.group + g) * s.dim + d, 0, sizeof(float) * 8 * (size_t)ch);
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
        const int n = s.len - p0 < 16 ? (int)(s.len - p0) : 16;
        const float *v[16];
        position_rows(v_cache, head, p0, n, v);
        prefetch_positions(v_cache, head, p0 + AVX2_AHEAD, 16);
        for (int64_t g = 0; g < s.group;) {
            const int64_t r = h * s.group + g;
            g += values_rows_f32(v, n, d, w + r * stride + p0, stride, acc + r * s.dim + d, s.dim,
                                 s.group - g, ch);
        }
    }
    for (int64_t g = 0; g < s.group; g++) {
        const int64_t r = h * s.group + g;
        const __m256 inv = _mm256_set1_ps(1.0f / total[r]);
        for (int64_t i = d; i < d + 8 * ch; i += 8)
            _mm256_storeu_ps(out + (s.h0 * s.group + r) * s.dim + i,
                             _mm256_mul_ps(_mm256_loadu_ps(acc + r * s.dim + i), inv));
    }
}

/* One fp32 decode token by the whole team, as attend_together does it for bf16 (every thread of
 * the enclosing parallel region calls it): the keys split by chunks of 16 positions, the softmax
 * by query rows, the values by (KV head, 32 dims); each score, row sum and output element as
 * attend_f32 computes it, so the same bits. For one token of a model with 3 KV heads on 2
 * threads, which took a head a task: one thread read two heads' keys and values. One token of
 * the embedded model over 30 layers' caches (2 threads, best of 11 alternating rounds, AMD EPYC
 * Zen 3), against a head a task: 37 positions 0.92x (the barriers: +1.5 us a layer), 330 1.12x,
 * 1000 1.07x, 3000 1.17x. */
static inline __attribute__((always_inline)) void attend_together_f32(
        const float *q, const float *k_cache, const float *v_cache, span_t s, float scale,
        float *scores, float *acc, float *total, float *out, int more) {
    const int64_t heads = s.h1 - s.h0, rows = heads * s.group, units = (s.dim + 31) / 32;
    const int64_t chunks = (s.len + 15) / 16, t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p_lo = chunks * t / T * 16, p_end = chunks * (t + 1) / T * 16;
    const int64_t stride = row_floats(s.len), r_lo = rows * t / T, r_hi = rows * (t + 1) / T;
    span_t mine = s;  /* this thread's positions: whole quads below the last thread's end */
    mine.len = p_end < s.len ? p_end : s.len;
    scores_f32(q, k_cache, mine, scale, scores, stride, p_lo);
#pragma omp barrier
    for (int64_t r = r_lo; r < r_hi; r++) total[r] = softmax_row_avx2(scores + r * stride, s.len);
#pragma omp barrier
    for (int64_t task = heads * units * t / T; task < heads * units * (t + 1) / T; task++)
        values_unit_f32(v_cache, s, task / units, task % units, scores, stride, acc, total, out);
    if (more) {
#pragma omp barrier  /* the next token's scores overwrite this one's */
    }
}
#endif

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
#if defined(__AVX2__) && defined(__FMA__)
    if (f32_kernels_fit(elem, s.dim)) {
        attend_f32((const float *)q, (const float *)k_cache, (const float *)v_cache, s, scale,
                   scores, acc, total, (float *)out);
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

#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
/* decode_together's scratch on the stack up to this many floats (9 query rows of up to ~380
 * positions), and no barrier after the last token (the region's end is one): a one-token call
 * from the caches took 2.3 -> 2.0 us at 64 positions, 3.85 -> 3.5 at 200 (AMD EPYC), of which
 * a decode step makes one a layer */
#define TOGETHER_STACK_FLOATS 4096

/* paged_decode_attention's tokens one after another, each by the whole team (attend_together:
 * bf16, elem 2; attend_together_f32: fp32, elem 4); s: every field but the table, len the
 * longest sequence's. */
static int decode_together(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads, span_t s, float scale,
                           int elem) {
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
        const int more = i + 1 < num_decodes;
#ifdef __AVX512BF16__
        if (elem == 2)
            attend_together_specialized((const uint16_t *)q + rows[i] * q_stride, k_cache, v_cache,
                                        token, scale, scores, acc, total,
                                        (uint16_t *)out + rows[i] * num_heads * s.dim, more);
#endif
#if defined(__AVX2__) && defined(__FMA__)
        if (elem == 4) {
            const float *qi = (const float *)q + rows[i] * q_stride;
            float *oi = (float *)out + rows[i] * num_heads * s.dim;
            if (s.dim == 64) {  /* a constant: the short dims loops unrolled */
                token.dim = 64;
                attend_together_f32(qi, k_cache, v_cache, token, scale, scores, acc, total, oi, more);
            } else {
                attend_together_f32(qi, k_cache, v_cache, token, scale, scores, acc, total, oi, more);
            }
        }
#endif
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
 * stream), bf16 and fp32 tokens go one at a time through the whole team (decode_together).
 * Every head's
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
#if defined(__AVX2__) && defined(__FMA__)
    /* too few (token, KV head) tasks to keep every thread busy: the team takes a token at a time */
    if (num_decodes * num_kv_heads < 2 * omp_get_max_threads() && omp_get_max_threads() > 1
        && f32_kernels_fit(elem, dim)) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_together(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                               rows, seqs, num_decodes, out, num_heads, s, scale, 4);
    }
#endif
#ifdef __AVX512BF16__
    /* too few (token, KV head) tasks to keep every thread busy: the team takes a token at a time */
    if (num_decodes * num_kv_heads < 2 * omp_get_max_threads() && omp_get_max_threads() > 1
        && bf16_kernels_fit(elem, dim)) {
        span_t s = {NULL, max_len, 0, num_kv_heads, group, num_kv_heads, dim, block_size};
        return decode_together(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                               rows, seqs, num_decodes, out, num_heads, s, scale, 2);
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

/* Fused CPU kernels for the decode hot path: RMSNorm (+ residual add), RoPE, KV-cache write,
 * SiLU-and-mul, greedy argmax (paged decode attention: decode_attention.c).
 *
 * Why C: in eager torch each of these is 5-15 small ops of 2-30 us each; a decode step of a
 * small model spends more time in that overhead than in its matmuls. Here each is one call.
 * Plain C + OpenMP, no torch headers, so it compiles in seconds at first use
 * (inferlab/kernels/cpu_ops.py) and links against torch's own libgomp (one thread pool).
 *
 * Work too small to share (a decode step's single rows) runs its loop outside any parallel
 * region: a region costs ~0.26 us even where an if clause keeps it on one thread (libgomp still
 * sets up a team of one), and a one-token decode step calls ~150 of these (the embedded model's
 * step without its linears and attention, AMD EPYC: 0.14-0.16 -> 0.11 ms).
 *
 * Tensors arrive as raw pointers; `elem` is the element size: 2 = bfloat16, 4 = float32.
 * Arithmetic is in fp32 and rounds to the tensor dtype where the torch reference rounds
 * (see the comment on each kernel); bf16 rounding is round-to-nearest-even, as torch's.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define CHUNK 256 /* floats per stack buffer when a row is processed in pieces */

/* Round a float to the tensor dtype and back: the value a torch op would have stored. */
static inline float round_to(float x, int elem) {
    return elem == 2 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

#ifdef __AVX512BF16__
/* One bf16 row of rms_norm, 16 values at a time (dim % 16 == 0), with the same roundings: the
 * generic loop below runs at ~2 G values/s, 6% of a 512-token prefill. */
static void rms_norm_bf16_row(const uint16_t *x, uint16_t *res, const uint16_t *weight,
                              uint16_t *out, int64_t dim, float eps) {
    __m512 sum_sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
        __m512 h = bf16x16_to_f32(x + i);
        if (res) {
            h = round_bf16(_mm512_add_ps(h, bf16x16_to_f32(res + i)));
            store_bf16(res + i, h);
        }
        sum_sq = _mm512_fmadd_ps(h, h, sum_sq);
    }
    const __m512 inv_rms = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(sum_sq) / (float)dim + eps));
    const uint16_t *h = res ? res : x;
    for (int64_t i = 0; i < dim; i += 16)
        store_bf16(out + i, _mm512_mul_ps(round_bf16(_mm512_mul_ps(bf16x16_to_f32(h + i), inv_rms)),
                                          bf16x16_to_f32(weight + i)));
}
#endif

/* Row r of rms_norm. */
static void rms_norm_row(const void *x, int64_t x_stride, void *residual, const void *weight,
                         void *out, int64_t dim, float eps, int elem, int64_t r) {
    const char *xr = (const char *)x + r * x_stride * elem;
    char *res = residual ? (char *)residual + r * dim * elem : NULL;
    char *o = (char *)out + r * dim * elem;
#ifdef __AVX512BF16__
    if (elem == 2 && dim % 16 == 0) {
        rms_norm_bf16_row((const uint16_t *)xr, (uint16_t *)res, (const uint16_t *)weight,
                          (uint16_t *)o, dim, eps);
        return;
    }
#endif
    float buf[CHUNK], sum_sq = 0.0f;
    for (int64_t c = 0; c < dim; c += CHUNK) {
        int64_t n = dim - c < CHUNK ? dim - c : CHUNK;
        load_f32(xr + c * elem, elem, buf, n);
        if (res) {
            float rb[CHUNK];
            load_f32(res + c * elem, elem, rb, n);
            for (int64_t i = 0; i < n; i++) buf[i] = round_to(buf[i] + rb[i], elem);
            store_f32(buf, elem, res + c * elem, n);
        }
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t i = 0; i < n; i++) sum_sq += buf[i] * buf[i];
    }
    float inv_rms = 1.0f / sqrtf(sum_sq / (float)dim + eps);
    const char *src = res ? res : xr;
    for (int64_t c = 0; c < dim; c += CHUNK) {
        int64_t n = dim - c < CHUNK ? dim - c : CHUNK;
        float wb[CHUNK];
        load_f32(src + c * elem, elem, buf, n);
        load_f32((const char *)weight + c * elem, elem, wb, n);
        for (int64_t i = 0; i < n; i++) buf[i] = round_to(buf[i] * inv_rms, elem) * wb[i];
        store_f32(buf, elem, o + c * elem, n);
    }
}

/* out[r] = rms_norm(h) * w where h = x[r] (+ residual[r], rounded and written back to residual).
 * Rounding as in HF Llama: normalise in fp32, round to the dtype, multiply by w, round again.
 * out may alias x. */
void rms_norm(const void *x, int64_t x_stride, void *residual, const void *weight, void *out,
              int64_t rows, int64_t dim, float eps, int elem) {
    /* a decode batch's rows shared from 16K elements, a row a claim below 64 rows: the other
     * thread would only wait (64 rows of 576: 0.44 -> 0.28 ms a step for 30 layers; silu_and_mul
     * likewise at 16 rows of 1,536: 0.40 -> 0.29 ms); fewer, no region at all (see the top) */
    if (rows * dim < (1 << 14)) {
        for (int64_t r = 0; r < rows; r++)
            rms_norm_row(x, x_stride, residual, weight, out, dim, eps, elem, r);
        return;
    }
#pragma omp parallel for schedule(dynamic, rows >= 64 ? 16 : 1)
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row(x, x_stride, residual, weight, out, dim, eps, elem, r);
}

#ifdef __AVX512BF16__
/* One bf16 head of rotary, 16 pairs at a time (dim % 32 == 0), the same sums as the loop below:
 * that loop, through fp32 buffers, ran at ~1.8 G values/s, 6% of a 512-token prefill. */
static void rotary_bf16_head(uint16_t *row, const float *c, const float *s, int64_t half) {
    for (int64_t i = 0; i < half; i += 16) {
        __m512 lo = bf16x16_to_f32(row + i), hi = bf16x16_to_f32(row + i + half);
        __m512 out_lo = _mm512_fmsub_ps(lo, _mm512_loadu_ps(c + i), _mm512_mul_ps(hi, _mm512_loadu_ps(s + i)));
        __m512 out_hi = _mm512_fmadd_ps(hi, _mm512_loadu_ps(c + i + half),
                                        _mm512_mul_ps(lo, _mm512_loadu_ps(s + i + half)));
        store_bf16(row + i, out_lo);
        store_bf16(row + i + half, out_hi);
    }
}
#endif

/* Token t of rotary. */
static void rotary_token(void *x, int64_t tok_stride, int64_t heads, const int64_t *positions,
                         const float *cos_table, const float *sin_table, int64_t tokens,
                         int64_t dim, int elem, int64_t t) {
    const int64_t half = dim / 2;
    const float *c = cos_table + positions[t] * dim, *s = sin_table + positions[t] * dim;
#ifdef __AVX512BF16__
    if (t + 2 < tokens)  /* the token two ahead, as the quantization reads rows (a 512-token
                            prefill's rotary: 1.65-1.66 -> 1.37-1.39 ms) */
        prefetch_lines((char *)x + (t + 2) * tok_stride * elem, heads * dim * elem);
#endif
    for (int64_t h = 0; h < heads; h++) {
        char *row = (char *)x + (t * tok_stride + h * dim) * elem;
#ifdef __AVX512BF16__
        if (elem == 2 && half % 16 == 0) {
            rotary_bf16_head((uint16_t *)row, c, s, half);
            continue;
        }
#endif
        float v[512], o[512];
        load_f32(row, elem, v, dim);
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            o[i] = v[i] * c[i] - v[i + half] * s[i];
            o[i + half] = v[i + half] * c[i + half] + v[i] * s[i + half];
        }
        store_f32(o, elem, row, dim);
    }
}

/* Neox (rotate-half) RoPE in place on `heads` heads of each token: x[t] at x + t*tok_stride,
 * head h at + h*dim. cos/sin are fp32 tables [max_positions, dim]. fp32 math, one rounding. */
void rotary(void *x, int64_t tok_stride, int64_t heads, const int64_t *positions,
            const float *cos_table, const float *sin_table, int64_t tokens, int64_t dim, int elem) {
    if (tokens * heads * dim < (1 << 16)) {
        for (int64_t t = 0; t < tokens; t++)
            rotary_token(x, tok_stride, heads, positions, cos_table, sin_table, tokens, dim, elem, t);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; t++)
        rotary_token(x, tok_stride, heads, positions, cos_table, sin_table, tokens, dim, elem, t);
}

/* Token t of write_kv: nothing for a negative slot. */
static inline void write_kv_token(const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                                  const int64_t *slots, void *k_cache, void *v_cache, size_t bytes,
                                  int elem, int64_t t) {
    if (slots[t] < 0) return;
    memcpy((char *)k_cache + slots[t] * bytes, (const char *)k + t * k_stride * elem, bytes);
    memcpy((char *)v_cache + slots[t] * bytes, (const char *)v + t * v_stride * elem, bytes);
}

/* Copy each token's K and V rows (kv_width = Hkv * D elements, contiguous within a token) to
 * cache slot slots[t] of caches laid out [slots, kv_width]. A negative slot is a padding row of
 * a fixed-size (graph) batch: it writes nothing. */
void write_kv(const void *k, int64_t k_stride, const void *v, int64_t v_stride,
              const int64_t *slots, void *k_cache, void *v_cache, int64_t tokens,
              int64_t kv_width, int elem) {
    const size_t bytes = (size_t)kv_width * elem;
    /* a prompt chunk's rows over the threads: each copy waits on its own cache misses (512
     * tokens into 30 layers' caches: 1.83 -> 1.07 ms) */
    if (tokens < 256) {
        for (int64_t t = 0; t < tokens; t++)
            write_kv_token(k, k_stride, v, v_stride, slots, k_cache, v_cache, bytes, elem, t);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; t++)
        write_kv_token(k, k_stride, v, v_stride, slots, k_cache, v_cache, bytes, elem, t);
}

#ifdef __AVX512BF16__
/* One bf16 row of silu_and_mul, 16 at a time (inter % 16 == 0). */
static void silu_mul_bf16_row(const uint16_t *gate, const uint16_t *up, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        store_bf16(y + i, silu_mul_ps(bf16x16_to_f32(gate + i), bf16x16_to_f32(up + i)));
}
#endif

/* Row r of silu_and_mul. */
static void silu_and_mul_row(const void *x, void *out, int64_t inter, int elem, int64_t r) {
    const char *gate = (const char *)x + r * 2 * inter * elem, *up = gate + inter * elem;
    char *o = (char *)out + r * inter * elem;
#ifdef __AVX512BF16__
    if (elem == 2 && inter % 16 == 0) {
        silu_mul_bf16_row((const uint16_t *)gate, (const uint16_t *)up, (uint16_t *)o, inter);
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (elem == 4 && inter % 8 == 0) {
        const float *g = (const float *)gate, *u = (const float *)up;
        for (int64_t i = 0; i < inter; i += 8)
            _mm256_storeu_ps((float *)o + i, silu_mul_avx2(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
        return;
    }
#endif
    for (int64_t c = 0; c < inter; c += CHUNK) {
        int64_t n = inter - c < CHUNK ? inter - c : CHUNK;
        float g[CHUNK], u[CHUNK], e[CHUNK];
        load_f32(gate + c * elem, elem, g, n);
        load_f32(up + c * elem, elem, u, n);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) e[i] = exp_nonpositive(-fabsf(g[i]));  /* never overflows */
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            float inv = 1.0f / (1.0f + e[i]), sig = g[i] >= 0.0f ? inv : e[i] * inv;
            g[i] = round_to(g[i] * sig, elem) * u[i];
        }
        store_f32(g, elem, o + c * elem, n);
    }
}

/* out[r] = silu(x[r, :inter]) * x[r, inter:], x [rows, 2*inter]. The reference rounds silu's
 * result to the dtype before the product; so does this. */
void silu_and_mul(const void *x, void *out, int64_t rows, int64_t inter, int elem) {
    if (rows * inter < (1 << 14)) {  /* as rms_norm */
        for (int64_t r = 0; r < rows; r++) silu_and_mul_row(x, out, inter, elem, r);
        return;
    }
#pragma omp parallel for schedule(dynamic, rows >= 64 ? 16 : 1)
    for (int64_t r = 0; r < rows; r++) silu_and_mul_row(x, out, inter, elem, r);
}

/* out[r] = the index of the largest of x[r, :cols] (row stride x_stride), the first one on
 * ties, as torch.argmax; NaNs are passed over. torch's CPU argmax walks a row one element at a
 * time, ~3.5 ms for 64 rows of a 49k vocabulary here; this compares 16 at a time. */
void argmax_rows(const float *x, int64_t x_stride, int64_t rows, int64_t cols, int64_t *out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_stride;
        float best = -INFINITY;
        int64_t at = 0;
#ifdef __AVX512F__
        __m512 top = _mm512_set1_ps(-INFINITY);
        __m512i where = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i step = _mm512_set1_epi32(16);
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            __m512 v = _mm512_loadu_ps(row + c);
            __mmask16 up = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);  /* strict: keeps the first */
            top = _mm512_mask_mov_ps(top, up, v);
            where = _mm512_mask_mov_epi32(where, up, idx);
            idx = _mm512_add_epi32(idx, step);
        }
        float lane_top[16];
        int32_t lane_at[16];
        _mm512_storeu_ps(lane_top, top);
        _mm512_storeu_si512(lane_at, where);
        for (int i = 0; i < 16; i++)
            if (lane_top[i] > best || (lane_top[i] == best && lane_at[i] < at && best > -INFINITY)) {
                best = lane_top[i];
                at = lane_at[i];
            }
        for (; c < cols; c++)
            if (row[c] > best) {
                best = row[c];
                at = c;
            }
#else
        for (int64_t c = 0; c < cols; c++)
            if (row[c] > best) {
                best = row[c];
                at = c;
            }
#endif
        out[r] = at;
    }
}

/* Frees the calling thread's OpenMP workers (OpenMP 5.0's omp_pause_resource_all; weak, so an
 * older libgomp without it still loads this library). Returns 0 when released.
 *
 * Why: libgomp counts the workers of every thread's pool, and once they outnumber the CPUs its
 * barriers spin 100 times instead of ~300,000 before sleeping on a futex. A model loaded on
 * the main thread and run on an engine thread leaves two pools, so every one of a decode
 * step's ~150 parallel regions paid a futex wake-up: the server's 16-stream decode steps took
 * 11-14% longer than with one pool. */
#pragma weak omp_pause_resource_all

int release_openmp_threads(void) {
    return omp_pause_resource_all ? omp_pause_resource_all(omp_pause_soft) : -1;
}

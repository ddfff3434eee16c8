/* The C kernels' entry points (ops.c, decode_attention.c, matmul.c, quant_linear.c, ...), for
 * the files that call one another's, and the dtype conversions several files need. */
#ifndef INFERLAB_CPU_KERNELS_H
#define INFERLAB_CPU_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Scratch memory that starts on a cache line, for data the kernels load as tiles or 64-byte
 * vectors: from malloc's 16-byte alignment every such row straddles two lines. A 512-token
 * prefill took 84-86 ms in the processes whose C forward's scratch landed at 16 or 48 bytes into
 * a line, 73-75 ms where it started on one. */
static inline void *alloc_lines(size_t bytes) {
    return aligned_alloc(64, (size_t)round_up((int64_t)bytes, 64));
}

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}

/* n values of bf16 (elem 2) or fp32 (elem 4) at src -> fp32 at dst. */
static inline void load_f32(const void *src, int elem, float *dst, int64_t n) {
    if (elem == 4) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

/* fp32 -> bf16, round to nearest even, NaN kept NaN (as torch). */
static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16;
    return (v.u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((v.u >> 16) | 0x40u) : (uint16_t)rounded;
}

/* n fp32 values at src -> bf16 (elem 2) or fp32 (elem 4) at dst. */
static inline void store_f32(const float *src, int elem, void *dst, int64_t n) {
    if (elem == 4) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *d = (uint16_t *)dst;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

/* exp(x) for x <= 0 (softmax after max subtraction, SiLU of either sign through exp(-|x|)):
 * Cody-Waite range reduction and a degree-6 polynomial; relative error below 2e-7. Written
 * without floorf/fmaxf so that gcc vectorizes the loops calling it without -ffast-math: the
 * rounding uses the 1.5 * 2^23 trick (round to nearest even). */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145752f - n * 1.42860677e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666418f
              + r * (0.00833338592f + r * 0.00138873165f)))));
    union { uint32_t u; float f; } scale = { .u = (uint32_t)((int32_t)n + 127) << 23 };
    return p * scale.f;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* exp_nonpositive, 8 lanes at a time (the same reduction and polynomial; 2^n built in the
 * exponent bits, n >= -126 after the clamp). */
static inline __attribute__((always_inline)) __m256 exp_nonpositive_avx2(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504f), shifter), shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-06f), r);
    static const float poly[] = {0.00833338592f, 0.0416666418f, 0.166666672f, 0.5f, 1.0f, 1.0f};
    __m256 p = _mm256_set1_ps(0.00138873165f);
    for (int i = 0; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(poly[i]));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* The lines of [at, at + bytes) asked for into L1: a row a kernel reads a step or two later (one
 * just written by the kernel before it, in part on the other core; a KV chunk of paged decode
 * attention). always_inline: a plain inline function holding only prefetches counts as having
 * no effect, and GCC 12 dropped its calls. */
static inline __attribute__((always_inline)) void prefetch_lines(const void *at, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)at + b, _MM_HINT_T0);
}

/* Dense fp32 register tiles (avx2_quant_linear.c, avx2_dynamic_linear.c): FP32_BLOCKS adjacent
 * blocks of 8 outputs by FP32_ROWS rows, 12 accumulators, 3 weight vectors and a broadcast: all
 * 16 registers. Each broadcast feeds 3 FMAs and each weight load 4 (one block by 8 rows took a
 * load and 8 broadcasts for 8 FMAs, bound by issuing them). 3 blocks by 4 rows beat 2 by 6 by
 * 1.3x at 1 row and 1.2x at 8 (more chains a row, whole tiles) and matched it from 16 rows on
 * (one thread, hot, 11 rounds, CPU time). */
#define FP32_BLOCKS 3
#define FP32_ROWS 4

/* 8 weights of a dense tile: fp32, or bf16 bits (BF16: a bf16 checkpoint's weights, exact in
 * both) widened by a shift, so that both give the same products. */
static inline __attribute__((always_inline)) __m256 dense_weights(const void *w, int64_t at, const int BF16) {
    if (BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + at))), 16));
    return _mm256_loadu_ps((const float *)w + at);
}

/* acc[r][c] = sum over k of w_c[k] * x_r[k]: BLOCKS blocks of weights [K][8 outputs] (fp32, or
 * bf16 with BF16), k_in * 8 apart from w, and ROWS rows of x (x_stride apart). Each output is one
 * chain over k = 0..K-1, whatever the tile or the weights' storage: a row's sums do not depend on
 * the rows beside it. */
static inline __attribute__((always_inline)) void fp32_tile_sums(const void *w, int64_t k_in, const float *x,
                                                                 int64_t x_stride, __m256 acc[FP32_ROWS][FP32_BLOCKS],
                                                                 const int BLOCKS, const int ROWS, const int BF16) {
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_setzero_ps();
    /* unrolled by 4, not 8: at 8 GCC folds the weight loads into the FMAs (12 loads an input,
     * not 3), 0.8x */
#pragma GCC unroll 4
    for (int64_t k = 0; k < k_in; k++) {
        __m256 wk[FP32_BLOCKS];
#pragma GCC unroll 3
        for (int c = 0; c < BLOCKS; c++) wk[c] = dense_weights(w, (c * k_in + k) * 8, BF16);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m256 xr = _mm256_broadcast_ss(x + r * x_stride + k);
#pragma GCC unroll 3
            for (int c = 0; c < BLOCKS; c++) acc[r][c] = _mm256_fmadd_ps(wk[c], xr, acc[r][c]);
        }
    }
}

/* silu(g) * u for 8 fp32 lanes, the same operations as silu_and_mul's scalar loop (e = exp(-|g|);
 * sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below): GCC does not vectorise that loop's
 * exp, and at 64 rows of 1,536 it was 3.7% of an fp32 decode step here (AMD EPYC Zen 3). */
static inline __m256 silu_mul_avx2(__m256 gate, __m256 up) {
    const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(gate, _mm256_set1_ps(-0.0f)));
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    const __m256 negative = _mm256_cmp_ps(gate, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sigmoid = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), negative);
    return _mm256_mul_ps(_mm256_mul_ps(gate, sigmoid), up);
}
#endif

/* The decode linears stream a task of NB blocks of outputs (b0 .. b0 + NB - 1), each block's
 * weights `block_bytes` long and laid out one after another, and a thread takes the next task
 * (b0 + NB ..) after. Where a prefetch `offset` bytes into block b of the task points: past the
 * block's end it runs on into the next task's block b, not into the task's other block, which is
 * being read already. Running on into the next task kept each stream warm across tasks:
 * single-row linears of the embedded model read 2-13% faster on an AMD EPYC (Zen 5). */
static inline const char *task_prefetch_at(const void *block, int64_t offset, int64_t block_bytes,
                                           int nb) {
    return (const char *)block + (offset < block_bytes ? offset : offset + (nb - 1) * block_bytes);
}

/* Element offset of position p's head kvh in a [blocks, block_size, Hkv, D] cache. block_size
 * is a power of two (checked by the caller): shifts, not divisions, on this per-position path. */
static inline int64_t kv_offset(const int32_t *table, int64_t p, int64_t block_size,
                                int64_t num_kv_heads, int64_t kvh, int64_t dim) {
    int64_t slot = (int64_t)table[p >> __builtin_ctzll(block_size)] * block_size
                   + (p & (block_size - 1));
    return (slot * num_kv_heads + kvh) * dim;
}

/* Attention over one sequence's first len cached positions, for the KV heads [h0, h1) and the
 * (h1 - h0) * G query heads that share them ("rows"). */
typedef struct {
    const int32_t *table;
    int64_t len, h0, h1, group, num_kv_heads, dim, block_size;
} span_t;

#ifdef __AVX512BF16__
#include <immintrin.h>

static inline __m512 bf16x16_widen(__m256i h) {  /* 16 bf16 in a register -> fp32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 bf16x16_to_f32(const uint16_t *src) {
    return bf16x16_widen(_mm256_loadu_si256((const __m256i *)src));
}

static inline __m512 bias_f32(const uint16_t *bias) {  /* 16 outputs' bias, or zeros */
    return bias ? bf16x16_to_f32(bias) : _mm512_setzero_ps();
}

static inline void store_bf16(uint16_t *dst, __m512 sum) {  /* one rounding, to nearest even */
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(sum));
}

static inline void store_sums(void *y, int y_elem, __m512 sum) {  /* bf16, or fp32 (y_elem 4) */
    if (y_elem == 4) _mm512_storeu_ps(y, sum);
    else store_bf16(y, sum);
}

/* Whether fp32 sums go to y as streaming stores (amx_rows, amx_gemm): they are a decode batch's
 * logits (12.6 MB at 64 rows of the embedded model), read next by the sampler, and stored past
 * the caches their lines are not first read in for ownership (an engine step's lm_head at 64
 * rows: 5.35-5.43 -> 3.48-3.76 ms, at 16 rows 2.08-2.13 -> 1.83-1.89 ms). Each store is 16 sums,
 * 64 bytes, so y must start on a cache line. */
static inline int streams_sums(const void *y, int y_elem, int64_t n_out) {
    return y_elem == 4 && ((uintptr_t)y & 63) == 0 && n_out % 16 == 0;
}

static inline void store_out(void *y, int y_elem, int stream, __m512 sum) {  /* see streams_sums */
    if (stream) _mm512_stream_ps((float *)y, sum);
    else store_sums(y, y_elem, sum);
}

static inline __m512 round_bf16(__m512 x) {  /* what storing as bf16 and loading back gives */
    return bf16x16_widen((__m256i)_mm512_cvtneps_pbh(x));
}

/* exp_nonpositive, 16 lanes at a time. */
static inline __m512 exp_nonpositive_ps(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-06f), r);
    static const float poly[] = {0.00833338592f, 0.0416666418f, 0.166666672f, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(0.00138873165f);
    for (int i = 0; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(poly[i]));
    return _mm512_scalef_ps(p, n);  /* p * 2^n, exact: the result is never below FLT_MIN */
}

/* silu(g) * u, 16 lanes of bf16 values g and u at a time: bf16(g * sigmoid(g)) * u from e =
 * exp(-|g|): sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below. The reciprocal is rcp14
 * refined by one Newton step (within an ulp of the quotient; rounding to bf16 then matches
 * torch's silu on all but a few in a million values): a 512-bit division retires one per ~16
 * cycles and was silu_and_mul's bound. silu_and_mul and amx_gemm's GLU outputs both take it. */
static inline __m512 silu_mul_ps(__m512 gate, __m512 up) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_nonpositive_ps(_mm512_or_ps(gate, _mm512_set1_ps(-0.0f)));  /* never overflows */
    const __m512 d = _mm512_add_ps(one, e);
    __m512 inv = _mm512_rcp14_ps(d);
    inv = _mm512_fmadd_ps(inv, _mm512_fnmadd_ps(d, inv, one), inv);
    const __mmask16 negative = _mm512_cmp_ps_mask(gate, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_mask_mul_ps(inv, negative, e, inv);
    return _mm512_mul_ps(round_bf16(_mm512_mul_ps(gate, sigmoid)), up);
}

/* Softmax numerators exp(x - max) of row[0, n): in place, or, given weights, as bf16 there
 * with zeros from n up to `upto` (a multiple of 16), the fp32 row left as it was; returns their
 * sum, taken lane by lane (position p in lane p % 16, in order) and then across the lanes.
 * Decode and prefill attention both take a row's weights from here, so a token's attention does
 * not depend on which of them ran it: a prompt cut into chunks otherwise (its last token a
 * decode-shaped step) gave other logits than the same prompt in one piece, and a seeded sample
 * another token. Straight to bf16 saves the prefill a pass over its scores. */
static inline float softmax_numerators_ps(float *row, int64_t n, uint16_t *weights, int64_t upto) {
    __m512 top_v = _mm512_set1_ps(-INFINITY);
    for (int64_t p = 0; p < n; p += 16) {
        const __mmask16 live = n - p >= 16 ? 0xffff : (__mmask16)((1u << (n - p)) - 1);
        top_v = _mm512_mask_max_ps(top_v, live, top_v, _mm512_maskz_loadu_ps(live, row + p));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(top_v));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t p = 0; p < n; p += 16) {
        const __mmask16 live = n - p >= 16 ? 0xffff : (__mmask16)((1u << (n - p)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(
            live, exp_nonpositive_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, row + p), top)));
        sum = _mm512_add_ps(sum, e);
        if (weights) store_bf16(weights + p, e);
        else _mm512_mask_storeu_ps(row + p, live, e);
    }
    for (int64_t p = (n + 15) / 16 * 16; weights && p < upto; p += 16) store_bf16(weights + p, _mm512_setzero_ps());
    return _mm512_reduce_add_ps(sum);
}

static inline __m512bh broadcast_pair(const uint16_t *x, int64_t pair) {  /* x[2p], x[2p+1] x16 */
    int32_t two;
    memcpy(&two, x + 2 * pair, 4);
    return (__m512bh)_mm512_set1_epi32(two);
}

/* Cache lines [at, at + 64 * lines) asked for into L2 across a loop of `steps` steps, an even
 * share each step: step i's share is prefetch_share(pf, i, per_step) with per_step =
 * ceil(lines / steps). A loop of arithmetic on data already cached thus streams in the data of
 * the work after it. at NULL (lines 0): nothing. */
typedef struct {
    const char *at;
    int64_t lines;
} prefetch_t;

static inline int64_t prefetch_per_step(prefetch_t pf, int64_t steps) {
    return steps > 0 ? (pf.lines + steps - 1) / steps : 0;  /* no steps: a thread with no rows */
}

static inline __attribute__((always_inline)) void prefetch_share(prefetch_t pf, int64_t step,
                                                                 int64_t per_step) {
    if (pf.lines == 0) return;  /* compiled out where no prefetch is ever asked for */
    for (int64_t i = step * per_step; i < (step + 1) * per_step && i < pf.lines; i++)
        _mm_prefetch(pf.at + i * 64, _MM_HINT_T1);
}

/* acc[r][j] = sum over k-pairs kp of row r of a (bf16, a_stride elements apart) times output
 * block j of b, in VNNI pairs: block j's pair kp (16 lanes x 2) at b + j * b_step + kp / 16 *
 * b_group + kp % 16 * b_pair. R <= 6 and NB <= 4 are constants, so the sums stay in registers;
 * each loaded vector of b serves all R rows. The register-tile GEMM (vnni_gemm.c) and prefill
 * attention without AMX both multiply this way; the GEMM streams in its next task's weights
 * (pf) on the way. */
static inline __attribute__((always_inline)) void vnni_tile_sums(
        const uint16_t *a, int64_t a_stride, const int R, int64_t pairs, const uint16_t *b,
        int64_t b_step, int64_t b_pair, int64_t b_group, const int NB, __m512 acc[6][4],
        prefetch_t pf) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++) acc[r][j] = _mm512_setzero_ps();
    const int64_t per_step = prefetch_per_step(pf, pairs);
    for (int64_t kp = 0; kp < pairs; kp++) {
        prefetch_share(pf, kp, per_step);
        /* pairs one after another (the GEMM's packed weights): a plain stride, which the
         * compiler turns into one pointer step; the general form costs ~5 instructions a step */
        const uint16_t *bk = b_group == 16 * b_pair ? b + kp * b_pair
                                                    : b + kp / 16 * b_group + kp % 16 * b_pair;
        __m512bh bv[4];
        for (int j = 0; j < NB; j++) bv[j] = (__m512bh)_mm512_loadu_si512(bk + j * b_step);
        for (int r = 0; r < R; r++) {
            const __m512bh av = broadcast_pair(a + r * a_stride, kp);
            for (int j = 0; j < NB; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], bv[j], av);
        }
    }
}

/* prefill_attention.c's tiles of one (sequence, KV head): K^T and V in vdpbf16ps pairs (the
 * products with them: attention_tiles.h). */
size_t head_tile_bytes(int64_t len, int64_t dim);
void layout_head(const uint16_t *k_cache, const uint16_t *v_cache, span_t s, int64_t h,
                 uint8_t *tiles, int64_t p_lo, int64_t p_hi);
/* decode_amx.c: bf16 decode tokens on AMX tiles, the bits prefill_attention.c gives them */
int decode_amx(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache, const uint16_t *v_cache,
               const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
               const int32_t *rows, const int32_t *seqs, int64_t num_decodes, uint16_t *out,
               span_t s, float scale);

#endif

void rms_norm(const void *x, int64_t x_stride, void *residual, const void *weight, void *out,
              int64_t rows, int64_t dim, float eps, int elem);
void rotary(void *x, int64_t tok_stride, int64_t heads, const int64_t *positions,
            const float *cos_table, const float *sin_table, int64_t tokens, int64_t dim, int elem);
void write_kv(const void *k, int64_t k_stride, const void *v, int64_t v_stride,
              const int64_t *slots, void *k_cache, void *v_cache, int64_t tokens,
              int64_t kv_width, int elem);
int prefill_attention_fits(int64_t dim);
int paged_prefill_attention(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                            const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                            const int32_t *query_start_loc, const int32_t *seq_lens,
                            const int32_t *seqs, int64_t num_seqs, uint16_t *out, int64_t num_heads,
                            int64_t num_kv_heads, int64_t dim, int64_t block_size, float scale);
int paged_decode_attention(const void *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t table_stride,
                           const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                           int64_t num_decodes, void *out, int64_t num_heads,
                           int64_t num_kv_heads, int64_t dim, int64_t block_size, float scale,
                           int elem);
void silu_and_mul(const void *x, void *out, int64_t rows, int64_t inter, int elem);
int bf16_linear(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
                const uint16_t *bias, void *y, int y_elem, int64_t n_out, int64_t k_in);

int has_amx(void);
void amx_configure_tiles(void);  /* every tile 16 rows x 64 bytes, for this thread */
void amx_release_tiles(void);
enum { GEMM_INT8 = 1, GEMM_GLU = 2, GEMM_WIDEN = 4 };  /* amx_gemm's flags */
/* A compressed weight that amx_gemm (GEMM_WIDEN) widens to bf16 a chunk at a time: `blocks`
 * writes output blocks [first, first + count) of `weight` (16 outputs each) to dst in
 * pack_bf16_vnni's layout. */
typedef struct {
    void (*blocks)(const void *weight, int64_t first, int64_t count, uint16_t *dst);
    const void *weight;
} widen_t;
int widened_gemm(const uint16_t *x, int64_t x_stride, int64_t rows, const widen_t *w, int64_t k_in,
                 const float *row_scale, const float *col_scale, const uint16_t *bias, uint16_t *y,
                 int64_t n_out);
int widened_glu(const uint16_t *x, int64_t x_stride, int64_t rows, const widen_t *w, int64_t k_in,
                const float *row_scale, const float *col_scale, const uint16_t *bias, uint16_t *y,
                int64_t inter);
int amx_gemm(const void *x, int64_t x_stride, int64_t rows, const void *packed, int64_t row_bytes,
             int flags, const float *row_scale, const float *col_scale, const uint16_t *bias,
             void *y, int y_elem, int64_t n_out);
#ifdef __AVX512BF16__
typedef struct {  /* one vnni_gemm call: y = x @ W^T (scaled as amx_gemm scales, + bias) */
    const void *x, *packed;  /* bf16: packed as pack_bf16_vnni; int8: see dynamic_linear.c */
    int64_t x_stride, k_in, n_out;  /* x_stride in elements of x */
    int y_elem;
    const float *row_scale, *col_scale;  /* or NULL */
    const uint16_t *bias;
    void *y;
    const int32_t *weight_sums;  /* NULL: bf16 x and W; else x is int8 codes + 128 (unsigned)
                                    and W int8 codes whose sums per output these are */
} gemm_args_t;
void vnni_gemm(const gemm_args_t *g, int64_t rows);
#endif
int bf16_glu(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
             const uint16_t *bias, uint16_t *y, int64_t inter, int64_t k_in);
int bf16_gemm(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
              int64_t k_in, const float *row_scale, const float *col_scale, const uint16_t *bias,
              void *y, int y_elem, int64_t n_out);

/* One linear layer of any weight format, as quant_linear.c's linear_forward takes it. */
enum { LINEAR_BF16 = 0, LINEAR_INT8 = 1, LINEAR_INT4 = 2, LINEAR_W8A8 = 3, LINEAR_FP8 = 4 };
typedef struct {
    int64_t kind, n_out, k_in, group;  /* group: inputs per scale (weight-only kinds) */
    const void *weight;  /* packed, see matmul.c (bf16), quant_linear.c, dynamic_linear.c */
    const float *scale;  /* W8A8, FP8: fp32 [N] */
    const uint16_t *group_scale, *group_zero;  /* INT8, INT4: bf16 [N/16][K/group][16]
                                                 (block_groups); zero NULL when symmetric */
    const uint16_t *bias;  /* bf16 [N] or NULL */
    const int32_t *weight_sums;  /* W8A8: each output's sum of codes [N] */
    const float *input_scale;  /* W8A8, FP8: one static activation scale, or NULL: per token */
} linear_t;
int dynamic_linear(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *y);
int dynamic_glu(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *y);
int linear_forward(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows,
                   uint16_t *y);
int glu_forward(const linear_t *l, const uint16_t *x, int64_t x_stride, int64_t rows, uint16_t *both,
                uint16_t *y);

/* One layer: n_out outputs (the codes padded to whole blocks of 8), k_in inputs (a multiple of
 * 8), scales per `group` inputs (a multiple of 8 dividing k_in), 8- or 4-bit codes; or bits 32:
 * dense fp32 weights [N/8, K, 8] as the codes (bits 16: their bf16 bits, exact weights of a bf16
 * checkpoint), no scales or offsets (group = k_in). act_bits 8:
 * the activations quantized per token (or with the static input_scale), scale fp32 per output,
 * codes in avx2_dynamic_linear.c's layouts: W8A8 (int8), or FP8 (fp8 1: e4m3 weights and
 * activations). */
typedef struct {  /* avx2_quant_linear.c, avx2_dynamic_linear.c */
    int64_t n_out, k_in, group, bits;
    const uint8_t *codes;
    const float *scale, *offset, *bias;  /* offset NULL for symmetric weights, bias [n_out] or NULL */
    int64_t act_bits;  /* 0: fp32 activations; 8: int8 or fp8 per token */
    const float *input_scale;  /* act_bits 8: one static activation scale, or NULL: per token */
    int64_t fp8;  /* act_bits 8: 1 for fp8 e4m3, 0 for int8 */
    /* bits 8 or 4: 1 when the codes' values (u * scale + offset, rounded once) are an fp32
     * layer's weights (a GGUF's Q8_0 or Q4_1 blocks), summed as the dense tiles sum them: that
     * layer's bits */
    int64_t dense_order;
} avx2_qlinear_t;

int avx2_quant_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows,
                      float *y);
int avx2_dynamic_linear(const avx2_qlinear_t *l, const float *x, int64_t x_stride, int64_t rows, float *y);
void avx2_quant_rows(const avx2_qlinear_t *l, const int64_t *ids, int64_t count, float *out);

/* The batch of one whole-model forward (model_forward.c for bf16, model_forward_f32.c for fp32):
 * M new tokens of B sequences: sequence b's are rows query_start_loc[b] .. query_start_loc[b + 1]
 * and end at position seq_lens[b] - 1. Sequences of one new token attend as decode rows
 * (decode_rows[i] of sequence decode_seqs[i]), the others (prefill_seqs) as prompts, which needs
 * prefill_attention_fits(head_dim) (bf16 only). */
typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size, table_stride, vocab;
    int64_t embed_packed;  /* embed is a tied lm_head's packed weight */
    float eps, final_eps, scale;
    const int64_t *token_ids, *positions, *slots;  /* [M] */
    const float *cos_table, *sin_table;  /* [P, D] */
    const int32_t *block_tables, *seq_lens, *query_start_loc;  /* [B, W], [B], [B + 1] */
    const int32_t *decode_rows, *decode_seqs, *prefill_seqs;  /* [Bd], [Bd], [Bp] */
    int64_t num_decodes, num_prefills;
    const void *embed, *final_norm;  /* the model's dtype: [vocab, H] or a tied head's packed
                                        weight (bf16 [vocab/16, H/2, 16, 2], fp32 [vocab/8, H, 8]), [H] */
    const avx2_qlinear_t *embed_codes;  /* fp32: a tied head held as codes (embed NULL), or NULL */
} forward_batch_t;

/* out [M, H] = the token ids' embeddings, elements of `elem` bytes. A packed table (a tied head's
 * layout: matmul.c's bf16 [vocab/16, H/2, 16, 2], avx2_quant_linear.c's fp32 [vocab/8, H, 8])
 * holds token t in block t / lanes as lane t % lanes, its inputs in runs of `run` elements, lanes
 * runs apart. */
static inline void embed_rows(const forward_batch_t *b, int64_t rows, void *out, int elem,
                              int64_t lanes, int64_t run) {
    const int64_t hidden = b->hidden, row_bytes = hidden * elem, run_bytes = run * elem;
    const char *embed = b->embed;
    for (int64_t m = 0; m < rows; m++) {
        const int64_t t = b->token_ids[m];
        char *dst = (char *)out + m * row_bytes;
        if (!b->embed_packed) {
            memcpy(dst, embed + t * row_bytes, (size_t)row_bytes);
            continue;
        }
        const char *lane = embed + ((t / lanes) * lanes * hidden + (t % lanes) * run) * elem;
        for (int64_t p = 0; p < hidden / run; p++)
            memcpy(dst + p * run_bytes, lane + p * lanes * run_bytes, (size_t)run_bytes);
    }
}
#endif

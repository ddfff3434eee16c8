/* Random sampling from logits in one call per batch: softmax with temperature, min-p, and a
 * two-level inverse CDF (inferlab/engine/sampler.py's torch path does the same in ~15 ops).
 *
 * Why C: at one stream the torch path cost ~0.2 ms of a ~6 ms decode step, almost all of it
 * per-op overhead; this reads a row of 49k logits twice and exponentiates it once.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define CDF_BLOCK 256 /* entries per block of the inverse CDF, as sampler.CDF_BLOCK */
#define EXP_FLOOR -87.0f /* below this the weight is 0: masked (-inf) entries are never drawn */

static inline float row_max(const float *row, int64_t cols) {
    float top = -INFINITY;
    int64_t c = 0;
#ifdef __AVX512F__
    __m512 lanes = _mm512_set1_ps(-INFINITY);
    for (; c + 16 <= cols; c += 16) lanes = _mm512_max_ps(lanes, _mm512_loadu_ps(row + c));
    top = _mm512_reduce_max_ps(lanes);
#endif
    for (; c < cols; c++) top = row[c] > top ? row[c] : top;
    return top;
}

/* The unnormalized softmax weight of one logit: exp((x - top) * inv_temp), 0 below the floor
 * or below min_p (the top entry's weight is 1, so min_p compares to the weight itself). */
static inline float weight_of(float x, float top, float inv_temp, float min_p) {
    float z = (x - top) * inv_temp;
    if (!(z >= EXP_FLOOR)) return 0.0f;  /* also NaN */
    float w = exp_nonpositive(z);
    return w < min_p ? 0.0f : w;
}

/* The fp32 sum of a block's weights (n <= CDF_BLOCK entries). */
static float block_weight(const float *x, int64_t n, float top, float inv_temp, float min_p) {
    int64_t c = 0;
    float sum = 0.0f;
#ifdef __AVX512BF16__  /* exp_nonpositive_ps (kernels.h) is there */
    const __m512 top_v = _mm512_set1_ps(top), t_v = _mm512_set1_ps(inv_temp);
    const __m512 floor_v = _mm512_set1_ps(EXP_FLOOR), min_p_v = _mm512_set1_ps(min_p);
    __m512 acc = _mm512_setzero_ps();
    for (; c + 16 <= n; c += 16) {
        __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), top_v), t_v);
        __mmask16 live = _mm512_cmp_ps_mask(z, floor_v, _CMP_GE_OQ);
        __m512 w = exp_nonpositive_ps(z);
        live &= _mm512_cmp_ps_mask(w, min_p_v, _CMP_GE_OQ);
        acc = _mm512_mask_add_ps(acc, live, acc, w);
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; c < n; c++) sum += weight_of(x[c], top, inv_temp, min_p);
    return sum;
}

/* One row: the first block whose running weight (fp32 block sums, accumulated in double)
 * passes u times the total, then the first entry of it whose running weight passes the rest.
 * Rounding can leave the target at or past the end: then the last entry with weight. */
static int64_t sample_row(const float *row, int64_t cols, float inv_temp, float min_p, double u,
                          double *cdf) {
    const float top = row_max(row, cols);
    const int64_t blocks = (cols + CDF_BLOCK - 1) / CDF_BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n = cols - b * CDF_BLOCK < CDF_BLOCK ? cols - b * CDF_BLOCK : CDF_BLOCK;
        total += block_weight(row + b * CDF_BLOCK, n, top, inv_temp, min_p);
        cdf[b] = total;
    }
    const double target = u * total;
    int64_t b = 0;
    while (b < blocks - 1 && !(cdf[b] > target)) b++;
    while (b > 0 && cdf[b] == cdf[b - 1]) b--;  /* past the end: back to a block with weight */
    double running = b > 0 ? cdf[b - 1] : 0.0;
    int64_t last = -1;
    for (int64_t c = b * CDF_BLOCK; c < cols && c < (b + 1) * CDF_BLOCK; c++) {
        float w = weight_of(row[c], top, inv_temp, min_p);
        if (w == 0.0f) continue;
        running += w;
        last = c;
        if (running > target) return c;
    }
    return last >= 0 ? last : 0;  /* 0: a row with no weight at all (every logit NaN or -inf) */
}

/* out[r] = a token drawn from softmax(x[r] * inv_temp[r]) without the entries whose
 * probability is below min_p[r] times the row's largest, at the uniform draw u[r] in [0, 1):
 * the same inverse CDF as sampler.inverse_cdf. x fp32 [rows, cols], row stride x_stride.
 * Returns 0, or -2 when out of memory. */
int sample_rows(const float *x, int64_t x_stride, int64_t rows, int64_t cols,
                const float *inv_temp, const float *min_p, const double *u, int64_t *out) {
    const int64_t blocks = (cols + CDF_BLOCK - 1) / CDF_BLOCK;
    double *cdf = malloc(sizeof(double) * (size_t)(blocks * rows));
    if (!cdf) return -2;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        out[r] = sample_row(x + r * x_stride, cols, inv_temp[r], min_p[r], u[r], cdf + r * blocks);
    free(cdf);
    return 0;
}

/* The codes of fp32 weights that are a GGUF's Q4_1, Q4_0 or Q8_0 blocks, found from the weights
 * alone (inferlab/kernels/block_codes.py says why and what; this is its arithmetic).
 *
 * Why C: torch took ~12 passes over the weights (minimum, maximum, scale, codes, the check),
 * 2.0-2.3 s of the embedded model's ~6 s fp32 load on 2 cores of an AMD EPYC Zen 3; here each
 * block of 32 is read once into registers and the whole model takes well under a tenth of that.
 *
 * Bits as block_codes.py defines them: Q4_1's d is the fp16 nearest (max - min) / 15 or one of
 * its two fp16 neighbours (the first whose codes give every value), q = clamp(round((w - min) /
 * d), 0, 15) with NaN (d = 0: one value) as 0; else Q4_0's, offset the largest magnitude m and
 * d = -m / 8; Q8_0's d = amax / 127 in fp32, q = round(w / d).
 * A block fits when every d * q (+ min) equals its weight; d * q is exact either way (an fp16
 * times a small integer), so one rounding, whether or not the compiler fuses the add.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GGUF_BLOCK 32

static inline float fp16_nearest(float x) { return (float)(_Float16)x; } /* round to nearest even */

/* The fp16 value beside h (a non-negative fp16) by `step` units of its last place, clamped at 0. */
static inline float fp16_beside(float h, int step) {
    _Float16 half = (_Float16)h;
    uint16_t bits;
    memcpy(&bits, &half, sizeof bits);
    int32_t moved = (int32_t)bits + step;
    bits = (uint16_t)(moved < 0 ? 0 : moved);
    memcpy(&half, &bits, sizeof half);
    return (float)half;
}

/* Codes of w[32] for scale d and offset low into q; whether low + d * q is every weight. The
 * comparisons, not fminf / fmaxf (calls, here), let the compiler vectorise; a NaN x gives 0, as
 * fmaxf would. */
static inline int codes_4bit(const float *w, float low, float d, int8_t *q) {
    int fits = 1;
    for (int i = 0; i < GGUF_BLOCK; i++) {
        float code = nearbyintf((w[i] - low) / d);
        code = code > 0.0f ? code : 0.0f;
        code = code < 15.0f ? code : 15.0f;
        q[i] = (int8_t)code;
        fits &= low + d * code == w[i];
    }
    return fits;
}

static inline int block_4bit(const float *w, int8_t *q, float *scale, float *offset) {
    float low = w[0], high = w[0];
    for (int i = 1; i < GGUF_BLOCK; i++) {
        low = w[i] < low ? w[i] : low; /* a NaN weight fails the check below whatever low is */
        high = w[i] > high ? w[i] : high;
    }
    const float nearest = fp16_nearest((high - low) / 15.0f);
    static const int steps[3] = {0, -1, 1};
    for (int s = 0; s < 3 && isfinite(nearest); s++) {
        *offset = low;
        *scale = fp16_beside(nearest, steps[s]);
        if (codes_4bit(w, low, *scale, q)) return 1;
    }
    /* Q4_0: d (q - 8), ggml's quantizer giving the largest magnitude q = 0, so the offset -8 d is
     * that weight and d = -it / 8 (exact); d q + -8 d is then exact, as the file's d (q - 8). */
    const float big = -low > high ? low : high;
    *offset = big;
    *scale = -big / 8.0f;
    return codes_4bit(w, big, *scale, q);
}

static inline int block_8bit(const float *w, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int i = 0; i < GGUF_BLOCK; i++) amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
    const float d = amax / 127.0f;
    int fits = isfinite(d);
    for (int i = 0; i < GGUF_BLOCK; i++) {
        float code = nearbyintf(w[i] / d);
        code = code == code ? code : 0.0f; /* d = 0: every weight 0, 0 / 0 */
        fits &= d * code == w[i]; /* so |code| <= 127: an int8 */
        q[i] = (int8_t)(fits ? code : 0.0f);
    }
    *scale = d;
    return fits;
}

/* Q4_1's or Q4_0's codes. w: `blocks` blocks of 32 fp32 weights, one after another; codes: 32 a
 * block (0..15), scale and offset: one a block. Returns how many blocks no such codes give (0:
 * all found). */
int64_t block_codes_4bit(const float *w, int64_t blocks, int8_t *codes, float *scale, float *offset) {
    int64_t misses = 0;
#pragma omp parallel for schedule(static) reduction(+ : misses)
    for (int64_t b = 0; b < blocks; b++)
        misses += !block_4bit(w + b * GGUF_BLOCK, codes + b * GGUF_BLOCK, scale + b, offset + b);
    return misses;
}

/* As block_codes_4bit for Q8_0's symmetric codes (-127..127), no offset. */
int64_t block_codes_8bit(const float *w, int64_t blocks, int8_t *codes, float *scale) {
    int64_t misses = 0;
#pragma omp parallel for schedule(static) reduction(+ : misses)
    for (int64_t b = 0; b < blocks; b++)
        misses += !block_8bit(w + b * GGUF_BLOCK, codes + b * GGUF_BLOCK, scale + b);
    return misses;
}

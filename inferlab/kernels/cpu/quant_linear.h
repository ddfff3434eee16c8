/* What quant_linear.c (weight-only int8 and int4 linears, AVX512-VNNI) shares with
 * quant_tiles.c (the same on AMX int8 tiles, for more rows): the weights' layouts and the
 * activations' codes (see quant_linear.c). */
#ifndef INFERLAB_QUANT_LINEAR_H
#define INFERLAB_QUANT_LINEAR_H
#include <stdint.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#define TILE_ROWS 4 /* rows of quant_linear.c's register kernel */
#define LINE 64 /* bytes of one block's weights per step */

/* One int4 line -> its two input quads as unsigned bytes u = q + 8, 16 outputs x 4 inputs
 * each, as vpdpbusd takes them: inputs 0-3 from the low nibbles, 4-7 from the high ones. */
static inline __attribute__((always_inline)) void int4_quads(const uint8_t *src, __m512i quads[2]) {
    const __m512i nibble = _mm512_set1_epi8(0xf);
    __m512i bytes = _mm512_loadu_si512(src);
    quads[0] = _mm512_and_si512(bytes, nibble);
#ifdef __GFNI__  /* each byte shifted right by 4 in one instruction: an affine map over GF(2) */
    quads[1] = _mm512_gf2p8affine_epi64_epi8(bytes, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
    quads[1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
#endif
}

/* A decode row's activations as the kernels take them (quantize_activations). */
typedef struct {
    const int8_t *hi, *lo;  /* [rows][K] */
    const float *scale;  /* [rows][K / block] */
    const int32_t *sum;  /* [rows][K / block] */
    int64_t block;
} act_t;

/* Where block b's weight lines start and how many bytes apart they are (quant_linear.c's
 * layouts): pairs of blocks alternate their lines; an odd last block's follow one another. */
typedef struct {
    const uint8_t *start;
    int64_t stride;
} lines_t;

static inline lines_t block_lines(const linear_t *l, const int BITS, int64_t b) {
    const int64_t block_bytes = l->k_in * 2 * BITS;
    const uint8_t *weight = (const uint8_t *)l->weight;
    if ((b ^ 1) >= l->n_out / 16)  /* the odd last block */
        return (lines_t){weight + b * block_bytes, LINE};
    return (lines_t){weight + (b & ~1) * block_bytes + (b & 1) * LINE, 2 * LINE};
}

/* Where 16-output block b's group scales (or zero points) start: [K/group][16] each, the blocks
 * one after another ([N/16][K/group][16]), so that a task reads each of its blocks' in order,
 * and a thread's tasks, one after another, read on where the task before stopped. */
static inline const uint16_t *block_groups(const uint16_t *values, const linear_t *l, int64_t b) {
    return values + b * (l->k_in / l->group) * 16;
}

/* Inputs per activation scale: the largest power of two up to 64 dividing the group. */
static inline int64_t act_block(const linear_t *l) {
    int64_t block = 64;
    while (l->group % block) block /= 2;
    return block;
}

int quant_tiles_fit(const linear_t *l, int64_t rows);
int quant_tiles(const linear_t *l, const act_t *x, int64_t rows, uint16_t *y);
#endif
#endif

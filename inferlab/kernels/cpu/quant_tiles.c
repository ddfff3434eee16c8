/* Weight-only int8 and int4 linears (W8A16, W4A16) on AMX int8 tiles, for decode batches of 9
 * to 64 rows: the bits quant_linear.c's register kernel gives each row alone, so a token's
 * hidden states do not depend on how many rows came with it. Per 64-input activation block the
 * products are exact int32 sums (tdpbsud: the rows' signed codes hi and lo times the weights'
 * unsigned codes), and each leaves the tiles for its rows' power-of-two scale, the fp32 steps of
 * quant_linear.c's quant_blocks in their order.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "quant_linear.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__) && defined(__AMX_BF16__) && defined(__AMX_INT8__)
/* One output block's B tiles, one a 64-input activation block: 16 quads of its 16 outputs'
 * unsigned codes, as tdpbsud takes them, 16 lines apart. int8 lines are those quads as they
 * lie (a pair's alternate); int4 lines are unpacked to buf, each line's two quads in turn. */
static lines_t weight_tiles(const linear_t *l, const int BITS, int64_t b, uint8_t *buf) {
    const lines_t w = block_lines(l, BITS, b);
    if (BITS == 8) return w;
    for (int64_t line = 0; line < l->k_in / 8; line++) {
        __m512i quads[2];
        _mm_prefetch((const char *)w.start + (line + 32) * w.stride, _MM_HINT_T0);
        _mm_prefetch((const char *)w.start + (line + 96) * w.stride, _MM_HINT_T1);
        int4_quads(w.start + line * w.stride, quads);
        _mm512_store_si512(buf + 2 * line * 64, quads[0]);
        _mm512_store_si512(buf + (2 * line + 1) * 64, quads[1]);
    }
    return (lines_t){buf, LINE};
}

#define CHUNK_BLOCKS 8 /* output blocks that share each load of the activations' tiles */

/* A chunk's fp32 state for 16 rows: each block's group sums and outputs, [block][row][16]. */
typedef struct {
    float sum[CHUNK_BLOCKS][16][16], out[CHUNK_BLOCKS][16][16];
} chunk_state_t;

/* The sums of block j's activation block a (C tiles: hi, lo) into its rows' group sums, as
 * quant_blocks takes them; at the group's last block, the group into the outputs. */
static inline __attribute__((always_inline)) void act_block_sums(
        const linear_t *l, const int BITS, const act_t *x, int64_t r0, int64_t block, int64_t a,
        const int32_t hl[2][256], float sum[16][16], float out[16][16]) {
    const int64_t k = l->k_in, act_blocks = k / 64, per_group = l->group / 64;
    const int last = (a + 1) % per_group == 0;
    const int64_t g = a / per_group;
    const __m512 none = _mm512_setzero_ps();
    const __m512 scale = last ? bf16x16_to_f32(block_groups(l->group_scale, l, block) + g * 16) : none;
    const __m512 zero = last && l->group_zero
        ? bf16x16_to_f32(block_groups(l->group_zero, l, block) + g * 16) : none;
    for (int m = 0; m < 16; m++) {
        const int64_t at = (r0 + m) * act_blocks;
        const __m512i hi = _mm512_load_si512(hl[0] + m * 16);
        const __m512i lo = _mm512_load_si512(hl[1] + m * 16);
        const __m512i offset = _mm512_set1_epi32((BITS == 8 ? 128 : 8) * x->sum[at + a]);
        const __m512i sums = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo), offset);
        __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(x->scale[at + a]),
                                   _mm512_load_ps(sum[m]));
        if (!last) {
            _mm512_store_ps(sum[m], s);
            continue;
        }
        if (l->group_zero) {  /* the group's sum of scaled codes, in quant_blocks' order */
            float xsum = 0.0f;
            for (int64_t i = g * per_group; i <= a; i++)
                xsum = fmaf((float)x->sum[at + i], x->scale[at + i], xsum);
            s = _mm512_fnmadd_ps(zero, _mm512_set1_ps(xsum), s);
        }
        _mm512_store_ps(out[m], _mm512_fmadd_ps(scale, s, _mm512_load_ps(out[m])));
        _mm512_store_ps(sum[m], _mm512_setzero_ps());
    }
}

/* Rows [r0, r0 + 16) of output blocks [b0, b0 + nb) on AMX int8 tiles, the same bits as
 * quant_blocks gives each row alone: per activation block the exact int32 sums of the rows'
 * signed codes hi (A tile 4) and lo (5) times a block's unsigned codes (B tile 6) in C tiles 0
 * and 1, then quant_blocks' fp32 steps in its order. Each load of the rows' codes serves the
 * chunk's blocks. The sums of the products before are scaled while a block's products run, and
 * its tiles are stored after. Rows past the last hold padding; their results are not stored. */
static inline __attribute__((always_inline)) void tile_chunk(
        const linear_t *l, const int BITS, const act_t *x, int64_t r0, int64_t b0, int64_t nb,
        const lines_t tiles[CHUNK_BLOCKS], chunk_state_t *st) {
    const int64_t k = l->k_in;
    int32_t c[2][2][256] __attribute__((aligned(64)));
    memset(st, 0, sizeof *st);
    int64_t issued = 0, j_prev = 0, a_prev = 0;
    for (int64_t a = 0; a < k / 64; a++) {
        _tile_loadd(4, x->hi + r0 * k + a * 64, k);
        _tile_loadd(5, x->lo + r0 * k + a * 64, k);
        for (int64_t j = 0; j < nb; j++, issued++) {
            if (BITS == 8 && r0 == 0)  /* the first rows read the weights from memory */
                for (int line = 0; line < 16; line++)
                    _mm_prefetch((const char *)tiles[j].start + ((a + 2) * 16 + line) * tiles[j].stride,
                                 _MM_HINT_T0);
            _tile_zero(0); _tile_zero(1);
            _tile_loadd(6, tiles[j].start + a * 16 * tiles[j].stride, tiles[j].stride);
            _tile_dpbsud(0, 4, 6); _tile_dpbsud(1, 5, 6);
            if (issued)
                act_block_sums(l, BITS, x, r0, b0 + j_prev, a_prev, c[(issued - 1) & 1],
                               st->sum[j_prev], st->out[j_prev]);
            _tile_stored(0, c[issued & 1][0], 64);
            _tile_stored(1, c[issued & 1][1], 64);
            j_prev = j;
            a_prev = a;
        }
    }
    act_block_sums(l, BITS, x, r0, b0 + j_prev, a_prev, c[(issued - 1) & 1],
                   st->sum[j_prev], st->out[j_prev]);
}

/* A tile takes 16 rows whatever the count: up to 12, the register kernel's groups of 4 rows
 * were as fast or faster (the model's linears at 8 rows: W8A16 5.9 against 6.0-6.2 ms on
 * tiles, W4A16 4.8 against 6.7-6.9; at 16 rows 8.8 and 8.0 against 6.6 and 7.4). */
int quant_tiles_fit(const linear_t *l, int64_t rows) {
    return rows > 3 * TILE_ROWS && act_block(l) == 64 && has_amx();
}

/* All rows on tiles: each thread a contiguous range of output blocks, in chunks; a chunk's B
 * tiles once (int4 unpacked to the thread's buffer), then each 16 rows. Returns 0, or -2 when a
 * thread's buffers could not be allocated. */
int quant_tiles(const linear_t *l, const act_t *x, int64_t rows, uint16_t *y) {
    int failed = 0;
    const int64_t n = l->n_out, blocks = n / 16, tile_bytes = l->k_in / 64 * 1024;
    const int BITS = l->kind == LINEAR_INT8 ? 8 : 4;
#pragma omp parallel
    {
        chunk_state_t *st = alloc_lines(sizeof(chunk_state_t));
        uint8_t *buf = BITS == 4 ? alloc_lines((size_t)(CHUNK_BLOCKS * tile_bytes)) : NULL;
        const int ok = st && (BITS == 8 || buf);
        if (!ok) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        else amx_configure_tiles();
        const int t = omp_get_thread_num(), threads = omp_get_num_threads();
        const int64_t end = blocks * (t + 1) / threads;
        for (int64_t b0 = blocks * t / threads; ok && b0 < end; b0 += CHUNK_BLOCKS) {
            const int64_t nb = end - b0 < CHUNK_BLOCKS ? end - b0 : CHUNK_BLOCKS;
            lines_t tiles[CHUNK_BLOCKS];
            for (int64_t j = 0; j < nb; j++)
                tiles[j] = BITS == 8 ? weight_tiles(l, 8, b0 + j, NULL)
                                     : weight_tiles(l, 4, b0 + j, buf + j * tile_bytes);
            for (int64_t r0 = 0; r0 < rows; r0 += 16) {
                if (BITS == 8) tile_chunk(l, 8, x, r0, b0, nb, tiles, st);
                else tile_chunk(l, 4, x, r0, b0, nb, tiles, st);
                for (int64_t j = 0; j < nb; j++) {
                    const __m512 bias = bias_f32(l->bias ? l->bias + (b0 + j) * 16 : NULL);
                    for (int64_t m = r0; m < rows && m < r0 + 16; m++)
                        store_bf16(y + m * n + (b0 + j) * 16,
                                   _mm512_add_ps(_mm512_load_ps(st->out[j][m - r0]), bias));
                }
            }
        }
        if (ok) amx_release_tiles();
        free(st);
        free(buf);
    }
    return failed ? -2 : 0;
}
#elif defined(__AVX512BF16__) && defined(__AVX512VNNI__)
int quant_tiles_fit(const linear_t *l, int64_t rows) {
    (void)l;
    (void)rows;
    return 0;
}
int quant_tiles(const linear_t *l, const act_t *x, int64_t rows, uint16_t *y) {
    (void)l;
    (void)x;
    (void)rows;
    (void)y;
    return -1;
}
#endif

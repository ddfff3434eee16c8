/* GEMM for CPUs without AMX: bf16 (matmul.c's bf16_gemm calls it for more than 4 rows) and
 * W8A8's int8 codes (dynamic_linear.c).
 *
 * Register tiles of up to GEMM_ROWS rows x GEMM_BLOCKS blocks of 16 outputs (24 of the 32
 * zmm registers accumulate; vnni_tile_sums), each k-step's GEMM_BLOCKS weight vectors loaded
 * once for all the tile's rows. A task is GEMM_BLOCKS blocks by up to GEMM_CHUNK_ROWS rows, so
 * its weights (<= 200 KB) are read from memory once and then from L2 for every row tile. The
 * 4-row kernel read every weight again for each 4 rows: 0.35 TFLOP/s at 512 rows against
 * oneDNN's 0.8-0.9 on an AMD EPYC (Zen 5) without AMX.
 *
 * A task's first row tile waits for its weights to come from memory, the others find them in
 * L2: at 64 rows (a decode batch) the model's linears took 31-32 ms a pass from memory against
 * ~23 ms from cache. So while a call's first row chunk is handed out, each thread claims its
 * next task one ahead and streams that task's weights into L2 as its row tiles run
 * (vnni_tile_sums' prefetch): the 64-row pass 8-11% faster, 256 rows ~4% (A/B in BENCHMARKS.md;
 * `benchmarks/gemm.py --model-pass` times the pass). */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

#define GEMM_ROWS 6
#define GEMM_BLOCKS 4
#define GEMM_CHUNK_ROWS 96
#define GEMM_MIN_TASKS 8 /* per thread */

/* acc[r][j] = the exact sums of int8 x (stored + 128, unsigned) times int8 W for rows r and
 * blocks j, W laid out [N/16][K/4][16][4]: vpdpbusd's unsigned operand is the broadcast quad
 * of x, so 128 * sum(w) comes off at the end. On an AMD EPYC (Zen 5) vpdpbusd retires as fast
 * as vdpbf16ps (benchmarks/simd_rate.py: 0.12 and 0.13 ns) with twice the products each. */
static inline __attribute__((always_inline)) void int8_tile_sums(
        const gemm_args_t *g, int64_t r0, int64_t b0, const int R, const int NB, __m512 acc[6][4],
        prefetch_t pf) {
    const int64_t k = g->k_in;
    const uint8_t *x = (const uint8_t *)g->x + r0 * g->x_stride;
    const int8_t *w = (const int8_t *)g->packed + b0 * k * 16;
    __v16si sums[6][4];  /* not __m512i: gcc 12 spilled those to the stack at every step */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++) sums[r][j] = (__v16si)_mm512_setzero_si512();
    const int64_t per_step = prefetch_per_step(pf, k / 4);
    for (int64_t q = 0; q < k / 4; q++) {
        prefetch_share(pf, q, per_step);
        __m512i wv[4];
        for (int j = 0; j < NB; j++) wv[j] = _mm512_loadu_si512(w + j * k * 16 + q * 64);
        for (int r = 0; r < R; r++) {
            int32_t four;
            memcpy(&four, x + r * g->x_stride + 4 * q, 4);
            const __m512i xv = _mm512_set1_epi32(four);
            for (int j = 0; j < NB; j++)
                sums[r][j] = (__v16si)_mm512_dpbusd_epi32((__m512i)sums[r][j], xv, wv[j]);
        }
    }
    for (int j = 0; j < NB; j++) {
        const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(g->weight_sums + (b0 + j) * 16), 7);
        for (int r = 0; r < R; r++)
            acc[r][j] = _mm512_cvtepi32_ps(_mm512_sub_epi32((__m512i)sums[r][j], offset));
    }
}

static inline __attribute__((always_inline)) void gemm_tile(
        const gemm_args_t *g, int64_t r0, int64_t b0, const int ROWS, const int BLOCKS,
        prefetch_t pf) {
    __m512 acc[6][4];  /* GEMM_ROWS x GEMM_BLOCKS */
    if (g->weight_sums) {
        int8_tile_sums(g, r0, b0, ROWS, BLOCKS, acc, pf);
    } else {
        const int64_t pairs = g->k_in / 2;
        vnni_tile_sums((const uint16_t *)g->x + r0 * g->x_stride, g->x_stride, ROWS, pairs,
                       (const uint16_t *)g->packed + b0 * pairs * 32, pairs * 32, 32, 512, BLOCKS,
                       acc, pf);
    }
    for (int b = 0; b < BLOCKS; b++) {
        const int64_t col = (b0 + b) * 16;
        const __m512 bv = bias_f32(g->bias ? g->bias + col : NULL);
        const __m512 cs = g->row_scale ? _mm512_loadu_ps(g->col_scale + col) : _mm512_setzero_ps();
        for (int m = 0; m < ROWS; m++) {
            __m512 sum = acc[m][b];
            if (g->row_scale) sum = _mm512_mul_ps(sum, _mm512_mul_ps(cs, _mm512_set1_ps(g->row_scale[r0 + m])));
            store_sums((char *)g->y + ((r0 + m) * g->n_out + col) * g->y_elem, g->y_elem,
                       _mm512_add_ps(sum, bv));
        }
    }
}

/* gemm_tile with its row and block counts as constants, so the sums stay in registers. */
static void gemm_tile_of(const gemm_args_t *g, int64_t r0, int64_t b0, int rows, int blocks,
                         prefetch_t pf) {
#define GEMM_TILE(R, B) gemm_tile(g, r0, b0, R, B, pf)
#define GEMM_ROW_CASES(B) switch (rows) { \
        case 1: GEMM_TILE(1, B); break; case 2: GEMM_TILE(2, B); break; \
        case 3: GEMM_TILE(3, B); break; case 4: GEMM_TILE(4, B); break; \
        case 5: GEMM_TILE(5, B); break; default: GEMM_TILE(6, B); break; }
    switch (blocks) {
    case 1: GEMM_ROW_CASES(1) break;
    case 2: GEMM_ROW_CASES(2) break;
    case 3: GEMM_ROW_CASES(3) break;
    default: GEMM_ROW_CASES(4) break;
    }
#undef GEMM_ROW_CASES
#undef GEMM_TILE
}

/* Claims the next task while fewer than `below` have been handed out, else returns `tasks`.
 * Two threads may pass the check together, so a claim can land at or past `below`, or past
 * the last task: callers treat any value >= `tasks` as none. */
static int64_t claim_task(int64_t *handed, int64_t tasks, int64_t below) {
    int64_t seen, task;
#pragma omp atomic read
    seen = *handed;
    if (seen >= below) return tasks;
#pragma omp atomic capture
    task = (*handed)++;
    return task;
}

void vnni_gemm(const gemm_args_t *g, int64_t rows) {
    const int64_t blocks = g->n_out / 16, col_tasks = (blocks + GEMM_BLOCKS - 1) / GEMM_BLOCKS;
    /* rows cut finer when there are few output groups (a decode batch through o_proj: 9), so
     * that GEMM_MIN_TASKS tasks share out evenly */
    const int64_t wanted = (GEMM_MIN_TASKS * omp_get_max_threads() + col_tasks - 1) / col_tasks;
    const int64_t even = (rows + wanted - 1) / wanted, fine = (even + GEMM_ROWS - 1) / GEMM_ROWS * GEMM_ROWS;
    const int64_t chunk = fine < GEMM_CHUNK_ROWS ? fine : GEMM_CHUNK_ROWS;
    const int64_t row_chunks = (rows + chunk - 1) / chunk;
    const int64_t tasks = row_chunks * col_tasks;
    const int64_t block_bytes = g->weight_sums ? g->k_in * 16 : g->k_in * 32;  /* int8 : bf16 */
    int64_t handed = 0;  /* tasks claimed so far */
    /* Tasks are claimed one at a time (on this VM one core is often slowed by a neighbour, see
     * amx_gemm). While the first row chunk's tasks (the weights' first pass, from memory) are
     * handed out, a thread also holds its next one, to prefetch, except the last few: they go to
     * whoever is free first. Later row chunks find the weights in cache. */
    const int64_t ahead_below = col_tasks < tasks - 2 * omp_get_max_threads()
        ? col_tasks : tasks - 2 * omp_get_max_threads();
#pragma omp parallel shared(handed)
    {
        int64_t task = claim_task(&handed, tasks, tasks);
        while (task < tasks) {
            const int64_t next = claim_task(&handed, tasks, ahead_below);
            const int64_t r0 = task / col_tasks * chunk, b0 = task % col_tasks * GEMM_BLOCKS;
            const int64_t r1 = rows < r0 + chunk ? rows : r0 + chunk;
            const int nb = blocks - b0 < GEMM_BLOCKS ? (int)(blocks - b0) : GEMM_BLOCKS;
            prefetch_t pf = {NULL, 0};
            const int64_t next_b0 = next % col_tasks * GEMM_BLOCKS;
            if (next < tasks && next_b0 != b0) {  /* the same blocks are in cache already */
                pf.at = (const char *)g->packed + next_b0 * block_bytes;
                pf.lines = (blocks - next_b0 < GEMM_BLOCKS ? blocks - next_b0 : GEMM_BLOCKS) * block_bytes / 64;
            }
            const int64_t tiles = (r1 - r0 + GEMM_ROWS - 1) / GEMM_ROWS;
            for (int64_t i = 0; i < tiles; i++) {  /* an even share of the prefetch each */
                const int64_t r = r0 + i * GEMM_ROWS, lo = pf.lines * i / tiles;
                const prefetch_t share = {pf.at ? pf.at + lo * 64 : NULL, pf.lines * (i + 1) / tiles - lo};
                gemm_tile_of(g, r, b0, r1 - r < GEMM_ROWS ? (int)(r1 - r) : GEMM_ROWS, nb, share);
            }
            task = next < tasks ? next : claim_task(&handed, tasks, tasks);
        }
    }
}
#endif

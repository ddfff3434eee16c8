/* bf16 linear layers on CPUs with AVX512-BF16, and AMX where the CPU has it.
 *
 * Why: oneDNN's bf16 path reads weights at about a third of the memory bandwidth when a decode
 * step multiplies a few rows by them, and a small model's decode step is mostly that. Both
 * kernels here read one weight layout, so a layer keeps a single copy:
 *
 *   packed [N/16][K/2][16][2]: for each block of 16 outputs and each pair of inputs, the 16
 *   outputs' two weights side by side (64 bytes). It is the VNNI layout vdpbf16ps and AMX's
 *   B tiles take: a k-pair of one row of x, broadcast, times 64 packed bytes gives 16 outputs'
 *   partial sums with no horizontal reduction, and 16 consecutive k-pairs of a block are one
 *   1 KiB AMX tile.
 *
 * Without AMX, up to VNNI_MAX_ROWS rows take the AVX512 kernel (bound by reading the weights
 * once) and more the register tiles of 6 rows x 64 outputs (vnni_gemm.c); both sum each output
 * as one chain in k order. AMX tiles (16x32 x 32x16 per instruction) sum in their own order,
 * which no AVX512 code reproduces, so on a CPU with AMX every row count runs on tiles: up to
 * AMX_MAX_ROWS rows on tiles of that many rows (amx_rows), more in blocks of 32 (amx_gemm).
 * Either way a row's result does not depend on the other rows. Sums are fp32 and round to bf16
 * once at the end.
 * N must be a multiple of 16 and K of 32 (checked by the caller).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

#define VNNI_MAX_ROWS 4
#define AMX_MAX_ROWS 16 /* amx_rows; more go to amx_gemm's blocks of 32 (amx_gemm.c) */
/* amx_rows: how far ahead on each weight stream. Half an iteration's 2 KiB: the 121 linears of
 * the embedded model from memory took 8.3-8.4 ms at 1 row and 9.3 at 16 (2,048 bytes ahead:
 * 8.9 and 9.9-10.0; 4,096: 9.1 and 10.0; none: 9.4 and 10.2) */
#define AMX_PREFETCH_BYTES 1024

/* w [N, K] row-major -> packed [N/16][K/2][16][2]. */
void pack_bf16_vnni(const uint16_t *w, uint16_t *packed, int64_t n_out, int64_t k_in) {
    int64_t pairs = k_in / 2;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < n_out / 16; block++)
        for (int64_t kp = 0; kp < pairs; kp++)
            for (int j = 0; j < 16; j++) {
                const uint16_t *src = w + (block * 16 + j) * k_in + 2 * kp;
                uint16_t *dst = packed + ((block * pairs + kp) * 16 + j) * 2;
                dst[0] = src[0];
                dst[1] = src[1];
            }
}

/* Blocks b0 and b0 + 1 (an odd last block reads its own weights twice and keeps one result).
 * Each output's sum is one vdpbf16ps chain over the k-pairs in order, plus the bias: the sums
 * vnni_gemm's tiles make for more rows, so a row's outputs do not depend on how many rows come
 * with it (two chains, even and odd pairs, had made a request's logits depend on the batch).
 * ROWS is a constant so everything stays in registers; the two blocks' chains and the rows'
 * keep the adds overlapping. */
static inline __attribute__((always_inline)) void vnni_blocks(
        const uint16_t *x, int64_t x_stride, const int ROWS, const uint16_t *packed,
        const uint16_t *bias, void *y, int y_elem, int64_t n_out, int64_t k_in, int64_t b0) {
    const int64_t pairs = k_in / 2, blocks = n_out / 16;
    const int nb = blocks - b0 < 2 ? 1 : 2;
    const uint16_t *w[2] = {packed + b0 * pairs * 32, packed + (b0 + nb - 1) * pairs * 32};
    __m512 acc[2][VNNI_MAX_ROWS];
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < ROWS; m++) acc[b][m] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < pairs; kp++) {
        __m512bh xv[VNNI_MAX_ROWS];
        for (int m = 0; m < ROWS; m++) xv[m] = broadcast_pair(x + m * x_stride, kp);
        for (int b = 0; b < 2; b++) {  /* 2 KiB ahead on each weight stream */
            _mm_prefetch(task_prefetch_at(w[b], (kp + 32) * 64, pairs * 64, 2), _MM_HINT_T0);
            __m512bh wv = (__m512bh)_mm512_loadu_si512(w[b] + kp * 32);
            for (int m = 0; m < ROWS; m++) acc[b][m] = _mm512_dpbf16_ps(acc[b][m], wv, xv[m]);
        }
    }
    for (int b = 0; b < nb; b++) {
        __m512 bv = bias_f32(bias ? bias + (b0 + b) * 16 : NULL);
        for (int m = 0; m < ROWS; m++)
            store_sums((char *)y + (m * n_out + (b0 + b) * 16) * y_elem, y_elem,
                       _mm512_add_ps(acc[b][m], bv));
    }
}

/* Up to VNNI_MAX_ROWS rows, reading the weights once, two blocks a task. The switch sits inside
 * the parallel loop so that each case inlines vnni_blocks with a constant ROWS: gcc outlines
 * the loop body before it inlines, so a ROWS fixed outside reaches it as a variable, and the
 * row loops then run (and branch) on every k-pair. */
static void vnni_linear(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
                        const uint16_t *bias, void *y, int y_elem, int64_t n_out, int64_t k_in) {
#pragma omp parallel for schedule(static)
    for (int64_t b0 = 0; b0 < n_out / 16; b0 += 2) {
        switch (rows) {
        case 1: vnni_blocks(x, x_stride, 1, packed, bias, y, y_elem, n_out, k_in, b0); break;
        case 2: vnni_blocks(x, x_stride, 2, packed, bias, y, y_elem, n_out, k_in, b0); break;
        case 3: vnni_blocks(x, x_stride, 3, packed, bias, y, y_elem, n_out, k_in, b0); break;
        default: vnni_blocks(x, x_stride, 4, packed, bias, y, y_elem, n_out, k_in, b0); break;
        }
    }
}

#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Linux hands out the AMX register state only to processes that ask for it. INFERLAB_CPU_AMX=0
 * keeps every kernel on its AVX512 path (what a CPU without AMX runs), for comparisons and
 * tests. */
static int amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) {
        const char *setting = getenv("INFERLAB_CPU_AMX");
        permitted = setting && !strcmp(setting, "0")
                    ? 0 : syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return permitted;
}

/* Every tile 64 bytes wide, for this thread; tiles 0, 1, 4 and 5 a_rows rows, the others 16.
 * amx_gemm (a_rows 16) uses 0-3 as C (16 x 16 fp32), 4-5 as A (16 rows x 32 bf16), 6-7 as B (16
 * k-pairs x 16 x 2); amx_rows 0-1 as C, 4-5 as A and 2-3, 6-7 as B; the attention kernels assign
 * their own (with a_rows 16). Every kernel configures its tiles and releases them when done (an
 * ldtilecfg takes ~50 ns here), as oneDNN's AMX kernels, in torch's calls on the same threads,
 * do with theirs. */
static void configure_tiles(int a_rows) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 2 || t == 4 || t == 5 ? a_rows : 16;
        cfg.colsb[t] = 64;
    }
    /* gcc does not see ldtilecfg read the whole struct and drops the stores above without this */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* Up to 16 rows (a decode batch) on AMX tiles of that many rows, two output blocks a task,
 * each block's weights streamed once as vnni_linear streams them. A row's sums are the bits
 * amx_gemm gives it (the same tile products over the same k-steps; a tile's rows do not see
 * each other), so a token's hidden states do not depend on how many rows came with it. */
static void amx_rows(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
                     const uint16_t *bias, void *y, int y_elem, int64_t n_out, int64_t k_in) {
    const int64_t row_bytes = k_in * 2, block_bytes = 16 * row_bytes, blocks = n_out / 16;
    const int stream = streams_sums(y, y_elem, n_out);
#pragma omp parallel
    {
        configure_tiles((int)rows);
        float c[2][16 * 16] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t b0 = 0; b0 < blocks; b0 += 2) {
            const int nb = blocks - b0 < 2 ? 1 : 2;
            const uint8_t *w[2] = {(const uint8_t *)packed + b0 * block_bytes,
                                   (const uint8_t *)packed + (b0 + nb - 1) * block_bytes};
            _tile_zero(0); _tile_zero(1);
            for (int64_t k = 0; k < row_bytes; k += 128) {
                for (int b = 0; b < 2; b++)  /* AMX_PREFETCH_BYTES ahead on each weight stream */
                    for (int line = 0; line < 32; line++)
                        _mm_prefetch(task_prefetch_at(w[b], k * 16 + AMX_PREFETCH_BYTES + 64 * line,
                                                      block_bytes, 2), _MM_HINT_T0);
                _tile_loadd(4, (const uint8_t *)x + k, x_stride * 2);
                _tile_loadd(6, w[0] + k * 16, 64);
                _tile_loadd(7, w[1] + k * 16, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (k + 64 < row_bytes) {  /* the next k-step in other tiles: no wait on these */
                    _tile_loadd(5, (const uint8_t *)x + k + 64, x_stride * 2);
                    _tile_loadd(2, w[0] + (k + 64) * 16, 64);
                    _tile_loadd(3, w[1] + (k + 64) * 16, 64);
                    _tile_dpbf16ps(0, 5, 2);
                    _tile_dpbf16ps(1, 5, 3);
                }
            }
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
            for (int b = 0; b < nb; b++) {
                const __m512 bv = bias_f32(bias ? bias + (b0 + b) * 16 : NULL);
                for (int64_t m = 0; m < rows; m++)
                    store_out((char *)y + (m * n_out + (b0 + b) * 16) * y_elem, y_elem, stream,
                              _mm512_add_ps(_mm512_load_ps(c[b] + m * 16), bv));
            }
        }
        if (stream) _mm_sfence();
        _tile_release();
    }
}

int has_amx(void) { return amx_permitted(); }
void amx_configure_tiles(void) { configure_tiles(16); }
void amx_release_tiles(void) { _tile_release(); }
#else
int has_amx(void) { return 0; }
void amx_configure_tiles(void) {}
void amx_release_tiles(void) {}
#endif

/* y [rows, N] = x [rows, K] (row stride x_stride elements) @ W^T for bf16 x and weights (packed
 * as pack_bf16_vnni), scaled as amx_gemm scales, on AMX tiles where the CPU has them, else on
 * AVX512 register tiles. Returns 0, or -2 when out of memory. */
int bf16_gemm(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
              int64_t k_in, const float *row_scale, const float *col_scale, const uint16_t *bias,
              void *y, int y_elem, int64_t n_out) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    if (has_amx())
        return amx_gemm(x, x_stride * 2, rows, packed, k_in * 2, 0, row_scale, col_scale, bias, y,
                        y_elem, n_out);
#endif
    const gemm_args_t g = {x, packed, x_stride, k_in, n_out, y_elem, row_scale, col_scale, bias,
                           y, NULL};
    vnni_gemm(&g, rows);
    return 0;
}

/* bf16_gemm for a compressed weight w (K = k_in): on AMX widened to bf16 a chunk at a time in
 * each thread's L2 (amx_gemm's GEMM_WIDEN), else the whole weight widened once per call. The
 * same bits either way: the tile products do not see where their B tiles came from. Returns 0,
 * or -2 when out of memory. */
int widened_gemm(const uint16_t *x, int64_t x_stride, int64_t rows, const widen_t *w, int64_t k_in,
                 const float *row_scale, const float *col_scale, const uint16_t *bias, uint16_t *y,
                 int64_t n_out) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    if (has_amx())
        return amx_gemm(x, x_stride * 2, rows, w, k_in * 2, GEMM_WIDEN, row_scale, col_scale, bias,
                        y, 2, n_out);
#endif
    uint16_t *wide = alloc_lines(sizeof(uint16_t) * (size_t)(n_out * k_in));
    if (!wide) return -2;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n_out / 16; b++) w->blocks(w->weight, b, 1, wide + b * 16 * k_in);
    const int status = bf16_gemm(x, x_stride, rows, wide, k_in, row_scale, col_scale, bias, y, 2,
                                 n_out);
    free(wide);
    return status;
}

/* bf16_glu for a compressed gate_up weight w (2N rows, the gate's first), widened and scaled as
 * widened_gemm widens and scales it, on AMX: the same bits as widened_gemm and then
 * silu_and_mul, without the [rows, 2N] products stored and read back. Returns 0, -2 when out of
 * memory, or 1 (nothing done) without AMX. */
int widened_glu(const uint16_t *x, int64_t x_stride, int64_t rows, const widen_t *w, int64_t k_in,
                const float *row_scale, const float *col_scale, const uint16_t *bias, uint16_t *y,
                int64_t inter) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    if (inter % 16 == 0 && has_amx())
        return amx_gemm(x, x_stride * 2, rows, w, k_in * 2, GEMM_WIDEN | GEMM_GLU, row_scale,
                        col_scale, bias, y, 2, inter);
#endif
    (void)x; (void)x_stride; (void)rows; (void)w; (void)k_in; (void)row_scale; (void)col_scale;
    (void)bias; (void)y; (void)inter;
    return 1;
}

/* y [rows, N] = x [rows, K] (row stride x_stride) @ W^T (+ bias), W packed by pack_bf16_vnni;
 * y bf16 (y_elem 2) or the fp32 sums unrounded (y_elem 4: logits). Returns 0, or -2 when out of
 * memory. */
int bf16_linear(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
                const uint16_t *bias, void *y, int y_elem, int64_t n_out, int64_t k_in) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    if (rows <= AMX_MAX_ROWS && has_amx()) {
        amx_rows(x, x_stride, rows, packed, bias, y, y_elem, n_out, k_in);
        return 0;
    }
#endif
    if (rows > VNNI_MAX_ROWS)
        return bf16_gemm(x, x_stride, rows, packed, k_in, NULL, NULL, bias, y, y_elem, n_out);
    vnni_linear(x, x_stride, rows, packed, bias, y, y_elem, n_out, k_in);
    return 0;
}

/* y [rows, inter] = silu(gate) * up, the outputs [rows, 2 * inter] of a gate_up layer (W packed
 * by pack_bf16_vnni and bias, if any, the gate's rows first) through silu_and_mul's activation,
 * the same bits, where amx_gemm takes the rows: the activation runs on each block's sums as they
 * leave the tiles, beside the next block's products (amx_gemm.c's pending_t), and the gate and
 * up outputs are never stored or read back, nor another parallel region started (30 such layers
 * at 64 rows: 5.7-6.4 -> 4.7-5.3 ms; at 512 rows 26.6-26.9 -> 25.6-25.9 ms, and on a faster
 * day 22.9-24.3 -> 20.7-21.0 ms once the activation ran beside the products). Returns 0, -2 when
 * out of memory, or 1 (nothing done) for rows it leaves to bf16_linear and silu_and_mul. */
int bf16_glu(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *packed,
             const uint16_t *bias, uint16_t *y, int64_t inter, int64_t k_in) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
    if (rows > AMX_MAX_ROWS && inter % 16 == 0 && has_amx())
        return amx_gemm(x, x_stride * 2, rows, packed, k_in * 2, GEMM_GLU, NULL, NULL, bias, y, 2, inter);
#endif
    return 1;
}

int has_bf16_linear(void) { return 1; }
#else
int has_bf16_linear(void) { return 0; } /* a CPU without AVX512-BF16: callers keep oneDNN */
int has_amx(void) { return 0; }
void amx_configure_tiles(void) {}
void amx_release_tiles(void) {}
#endif

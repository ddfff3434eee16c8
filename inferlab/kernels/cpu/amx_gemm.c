/* The AMX GEMM of bf16 (and int8) linears for more than AMX_MAX_ROWS rows (matmul.c): a
 * prompt's rows, and decode batches of more than 16 tokens. Blocks of 32 rows by 32 outputs,
 * four C tiles each, walked in column chunks whose weights fit in L2; see amx_gemm below. The
 * weights are matmul.c's packed bf16 layout or dynamic_linear.c's int8 one, or a compressed
 * weight that each thread widens to bf16 a chunk at a time (widen_t).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AMX_BF16__) && defined(__AMX_INT8__)
#include <immintrin.h>

#define L2_BUDGET_BYTES (1 << 20) /* weights an AMX thread keeps in its L2 at a time */
#define CHUNKS_PER_THREAD 2 /* column chunks per thread, handed out dynamically (4: ~15% slower) */
#define PREFETCH_STEPS 4 /* k-steps of 32 inputs (1 KiB of each B tile) fetched ahead */
#define COLS_OUTER_ROW_BLOCKS 2 /* up to this many blocks of 32 rows go outputs outer */

/* The A side of amx_gemm: x's rows, x_stride bytes apart, loaded as tiles in place; the rows of
 * a last partial block of 32 from tail, a zero-padded copy (row_bytes apart). */
typedef struct {
    const uint8_t *x, *tail;
    int64_t x_stride, tail_r0, row_bytes;
} a_rows_t;

static int pad_tail(a_rows_t *a, int64_t rows) {
    a->tail_r0 = rows / 32 * 32;
    a->tail = NULL;
    if (a->tail_r0 == rows) return 0;
    uint8_t *tail = alloc_lines((size_t)(32 * a->row_bytes));
    if (!tail) return -2;
    memset(tail, 0, (size_t)(32 * a->row_bytes));
    for (int64_t r = a->tail_r0; r < rows; r++)
        memcpy(tail + (r - a->tail_r0) * a->row_bytes, a->x + r * a->x_stride, (size_t)a->row_bytes);
    a->tail = tail;
    return 0;
}

/* Row r of one 32 x 32 output block from its four C tiles (c[0], c[1]: rows 0-15 of the two
 * 16-output halves; c[2], c[3]: rows 16-31), scaled, biased and rounded to bf16 once; two halves
 * go out as one 64-byte store. A GLU's halves are its gate and up outputs, rounded to bf16 as
 * they would be stored, and 16 outputs silu(gate) * up go out. fp32 sums (logits) go out as
 * streaming stores when y is on cache lines (see amx_gemm). */
static inline __attribute__((always_inline)) void store_block_row(
        float c[4][16 * 16], int r, int two_cols, int int8, int glu, const float *row_scale,
        const __m512 cs[2], const __m512 bv[2], void *y, int y_elem, int stream) {
    __m512 sum[2];
    for (int half = 0; half < 1 + two_cols; half++) {
        const float *tile = c[(r >> 4) * 2 + half] + (r & 15) * 16;
        sum[half] = int8 ? _mm512_cvtepi32_ps(_mm512_load_si512(tile)) : _mm512_load_ps(tile);
        if (row_scale)
            sum[half] = _mm512_mul_ps(sum[half], _mm512_mul_ps(cs[half], _mm512_set1_ps(*row_scale)));
        sum[half] = _mm512_add_ps(sum[half], bv[half]);
    }
    if (glu) store_bf16(y, silu_mul_ps(round_bf16(sum[0]), round_bf16(sum[1])));
    else if (two_cols && y_elem == 2) _mm512_storeu_si512(y, (__m512i)_mm512_cvtne2ps_pbh(sum[1], sum[0]));
    else
        for (int half = 0; half < 1 + two_cols; half++)
            store_out((char *)y + 16 * half * y_elem, y_elem, stream, sum[half]);
}

/* One block of the output: rows [r0, r0 + 32) (fewer at the end) by outputs [col, col + 32)
 * (16 when two_cols is 0, or for a GLU). */
typedef struct {
    int64_t r0, col;
    int two_cols, two_row_tiles;  /* else the second B (A) tile would multiply padding */
} out_block_t;

/* The B side of amx_gemm: the packed weights, and where a block's two B tiles of 16 outputs
 * each lie. A block of outputs [col, col + 32) takes weight rows col .. col + 31. A GLU's
 * weights are its gate's n_out rows and then its up projection's, and its block of outputs
 * [col, col + 16) takes gate rows col .. col + 15 and the up rows up_rows further in packed:
 * n_out, or in a widened chunk (gate rows, then up rows) the chunk's width. */
typedef struct {
    const uint8_t *packed;
    int64_t row_bytes, n_out, up_rows;  /* n_out: outputs of y */
    int glu;
    const widen_t *widen;  /* GEMM_WIDEN: the weight, widened a chunk at a time to packed */
} b_side_t;

static inline int64_t block_outputs(const b_side_t *b) { return b->glu ? 16 : 32; }

/* Outputs (their scales and biases) from a block's first B tile to its second. */
static inline int64_t second_output(const b_side_t *b) { return b->glu ? b->n_out : 16; }

/* Rows of packed from a block's first B tile to its second. */
static inline int64_t second_tile(const b_side_t *b) { return b->glu ? b->up_rows : 16; }

/* Lines to fetch to L2 over a run of blocks' k-steps: this block's k-step k takes share
 * step0 + k of per_step lines. */
typedef struct {
    prefetch_t lines;
    int64_t step0, per_step;
} prefetch_run_t;

/* What amx_gemm's threads share: the operands, and how the output blocks are cut into chunks. */
typedef struct {
    a_rows_t a;
    b_side_t b;
    int64_t rows, row_blocks, col_blocks, chunk_blocks, chunks, k_steps, threads;
    int int8, by_cols, cols_outer, stream, y_elem, claim_y;
    const float *row_scale, *col_scale;
    const uint16_t *bias;
    void *y;
} gemm_plan_t;

/* A multiplied block whose rows go to y while the next block's tile products run, a few before
 * each k-step's (pending_rows): its tiles stored at c, its outputs' scales and biases loaded.
 * Stored all at once after the next block's products were issued, a GLU block's silu(gate) * up
 * rows (~1,000 instructions) filled the reorder buffer behind them and mostly ran after them. 30
 * gate_up linears at 512 rows (ad hoc, the GLU fused): 22.9-24.3 -> 20.7-21.0 ms, against
 * ~18.3 as plain linears (rows after each k-step's products: 21.6-22.1); a 512-token prefill
 * 67-70 -> 65-68 ms, a 64-token decode step 40.5-40.9 -> 39.9 ms. */
typedef struct {
    float (*c)[16 * 16];  /* NULL: no block pending */
    out_block_t o;
    __m512 cs[2], bv[2];
} pending_t;

static inline __attribute__((always_inline)) pending_t pending_block(float c[4][16 * 16],
                                                                     out_block_t o,
                                                                     const gemm_plan_t *g) {
    pending_t s = {.c = c, .o = o, .cs = {_mm512_setzero_ps(), _mm512_setzero_ps()}};
    for (int half = 0; half < 2; half++) {
        const int has = half == 0 || o.two_cols;
        const int64_t at = o.col + half * second_output(&g->b);
        s.bv[half] = bias_f32(g->bias && has ? g->bias + at : NULL);
        if (g->row_scale && has) s.cs[half] = _mm512_loadu_ps(g->col_scale + at);
    }
    return s;
}

/* Where row r of block o goes in y. */
static inline char *block_row_y(const gemm_plan_t *g, out_block_t o, int64_t r) {
    return (char *)g->y + ((o.r0 + r) * g->b.n_out + o.col) * g->y_elem;
}

/* Rows [r_lo, r_hi) of block s from its stored tiles; int8 and glu constants, and s's tiles,
 * scales and biases copied into locals: y's stores may alias s and the plan for all the compiler
 * knows, and the one loop for every kind reloaded them and tested each flag for every row (~60
 * instructions a row). A 512-token bf16 prefill 88.3-88.9 -> 85.0 ms (builds alternated in one
 * process); W8A8's unchanged (72.5 -> 72.2: its epilogue waits on something else); the linears
 * at 64 rows from memory 2.13-2.18x -> 2.05-2.15x of a plain read (bf16), 2.69-2.79x -> 2.50x
 * (W8A8). */
static inline __attribute__((always_inline)) void block_rows(
        const pending_t *s, int r_lo, int r_hi, const int int8, const int glu,
        const float *row_scale, char *y, int64_t y_row_bytes, int y_elem, int stream) {
    float (*c)[16 * 16] = s->c;
    const int two_cols = s->o.two_cols;
    const __m512 cs[2] = {s->cs[0], s->cs[1]}, bv[2] = {s->bv[0], s->bv[1]};
    for (int r = r_lo; r < r_hi; r++)
        store_block_row(c, r, two_cols, int8, glu, row_scale ? row_scale + r : NULL, cs, bv,
                        y + r * y_row_bytes, y_elem, stream);
}

/* Rows [r_lo, r_hi) of the pending block (those past the last row of y skipped). */
static inline __attribute__((always_inline)) void pending_rows(const pending_t *s,
                                                               const gemm_plan_t *g, int r_lo,
                                                               int r_hi) {
    const int64_t left = g->rows - s->o.r0;  /* rows of y from the block's first */
    const int end = left < r_hi ? (int)left : r_hi;
    const float *row_scale = g->row_scale ? g->row_scale + s->o.r0 : NULL;
    char *y = block_row_y(g, s->o, 0);
    const int64_t y_row_bytes = g->b.n_out * g->y_elem;
    if (g->int8 && g->b.glu) block_rows(s, r_lo, end, 1, 1, row_scale, y, y_row_bytes, g->y_elem, g->stream);
    else if (g->int8) block_rows(s, r_lo, end, 1, 0, row_scale, y, y_row_bytes, g->y_elem, g->stream);
    else if (g->b.glu) block_rows(s, r_lo, end, 0, 1, row_scale, y, y_row_bytes, g->y_elem, g->stream);
    else block_rows(s, r_lo, end, 0, 0, row_scale, y, y_row_bytes, g->y_elem, g->stream);
}

/* The block's sums over the whole K, left in C tiles 0-3. first_use: the weights come from
 * memory, so ask for them PREFETCH_STEPS k-steps ahead; runs: weights (a GLU's in two runs)
 * and rows of A to fetch to L2 meanwhile. bf16 B tiles load with the
 * streaming hint (tileloaddt1): a row block reads each B tile once, and loaded plainly they
 * evicted its A tiles (36 KiB of rows at K = 576) from L1, which then came from L2 too (qkv
 * and gate_up at 2,048 rows: 1.13 and 3.62 ms -> 0.98 and 2.79; the model's linears at 64 rows
 * 25.7 -> 22.2 ms). int8 rows are half as long, a row block's A tiles and a block's B tiles fit
 * in L1 together, and the plain loads were ~5% faster (W8A8 at 512 rows). */
static inline __attribute__((always_inline)) void block_products(
        const gemm_plan_t *g, out_block_t o, int first_use, const prefetch_run_t runs[3],
        const pending_t *pending) {
    const a_rows_t *a = &g->a;
    const b_side_t *b = &g->b;
    const int int8 = g->int8;
    const int64_t row_bytes = a->row_bytes, k_steps = g->k_steps;
    const int in_tail = o.r0 >= a->tail_r0;
    const int64_t a_stride = in_tail ? row_bytes : a->x_stride;
    const uint8_t *a0 = in_tail ? a->tail : a->x + o.r0 * a->x_stride, *a1 = a0 + 16 * a_stride;
    const uint8_t *b0 = b->packed + o.col * row_bytes;
    const uint8_t *b1 = o.two_cols ? b0 + second_tile(b) * row_bytes : b0;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k = 0; k < row_bytes; k += 64) {
        for (int run = 0; run < 3; run++)
            prefetch_share(runs[run].lines, runs[run].step0 + k / 64, runs[run].per_step);
        if (first_use && k + PREFETCH_STEPS * 64 < row_bytes)
            for (int line = 0; line < 16; line++) {
                _mm_prefetch((const char *)b0 + (k + PREFETCH_STEPS * 64) * 16 + 64 * line, _MM_HINT_T0);
                _mm_prefetch((const char *)b1 + (k + PREFETCH_STEPS * 64) * 16 + 64 * line, _MM_HINT_T0);
            }
        const int r_lo = (int)(k / 64 * 32 / k_steps), r_hi = (int)((k / 64 + 1) * 32 / k_steps);
        if (pending->c) pending_rows(pending, g, r_lo, r_hi);  /* while this step's products run */
        if (g->claim_y)  /* this block's rows of y, owned by the time they are stored */
            for (int r = r_lo; r < r_hi && o.r0 + r < g->rows; r++) _m_prefetchw(block_row_y(g, o, r));
        _tile_loadd(4, a0 + k, a_stride);
        if (int8) {
            _tile_loadd(6, b0 + k * 16, 64); _tile_loadd(7, b1 + k * 16, 64);
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
        } else {
            _tile_stream_loadd(6, b0 + k * 16, 64); _tile_stream_loadd(7, b1 + k * 16, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        }
        if (o.two_row_tiles) {
            _tile_loadd(5, a1 + k, a_stride);
            if (int8) { _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7); }
            else { _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
        }
    }
}

static inline __attribute__((always_inline)) void store_tiles(float c[4][16 * 16], out_block_t o) {
    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
    if (o.two_row_tiles) { _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64); }
}

/* The weights of output blocks [first, first + count) (clipped at the last), as lines to
 * prefetch: one run, or a GLU's gate and up rows. */
static void block_weights(const b_side_t *b, int64_t first, int64_t count, prefetch_t out[2]) {
    const int64_t width = block_outputs(b), w0 = first * width;
    const int64_t w1 = (first + count) * width < b->n_out ? (first + count) * width : b->n_out;
    out[0] = (prefetch_t){(const char *)b->packed + w0 * b->row_bytes, (w1 - w0) * b->row_bytes / 64};
    out[1] = b->glu ? (prefetch_t){out[0].at + second_tile(b) * b->row_bytes, out[0].lines} : (prefetch_t){NULL, 0};
}

/* Row block rb's rows of A as lines to prefetch, when x's rows lie one after another and the
 * block is not in the padded tail; else none. */
static prefetch_t row_block_lines(const a_rows_t *a, int64_t rb) {
    if (a->x_stride != a->row_bytes || (rb + 1) * 32 > a->tail_r0) return (prefetch_t){NULL, 0};
    return (prefetch_t){(const char *)a->x + rb * 32 * a->row_bytes, 32 * a->row_bytes / 64};
}

/* A thread's pipeline: block j's tile products run while block j-1's rows are stored (see
 * pending_t). */
typedef struct {
    float c[2][4][16 * 16] __attribute__((aligned(64)));
    out_block_t last;
    int64_t count;  /* blocks multiplied; block i's tiles are stored in c[i & 1] */
} gemm_pipe_t;

/* The last block multiplied, as the pending block of the next (none before the first). */
static inline __attribute__((always_inline)) pending_t last_block(const gemm_plan_t *g,
                                                                  gemm_pipe_t *p) {
    return p->count ? pending_block(p->c[(p->count - 1) & 1], p->last, g) : (pending_t){.c = NULL};
}

/* Output blocks [c0, c1) for all rows (or, with fewer output blocks than threads, a thread's
 * share of the rows for all of them): one chunk. `following` is the chunk this thread takes
 * next, whose weights a walk rows outer fetches to L2 over this one's k-steps. Inlined: called
 * through a pointer to the plan, not inlined, a 512-token prefill took 76-78 ms, not 70-72. */
static inline __attribute__((always_inline)) void gemm_chunk(const gemm_plan_t *g, int64_t chunk,
                                                             int64_t following, gemm_pipe_t *p,
                                                             uint16_t *wide) {
    const int64_t c0 = g->by_cols ? chunk * g->chunk_blocks : 0;
    const int64_t c1 = g->by_cols && c0 + g->chunk_blocks < g->col_blocks ? c0 + g->chunk_blocks : g->col_blocks;
    gemm_plan_t widened;
    if (g->b.widen) {  /* the chunk's weights as bf16 in this thread's buffer, where its B tiles load */
        const int64_t w0 = c0 * block_outputs(&g->b);
        const int64_t w1 = c1 * block_outputs(&g->b) < g->b.n_out ? c1 * block_outputs(&g->b) : g->b.n_out;
        g->b.widen->blocks(g->b.widen->weight, w0 / 16, (w1 - w0) / 16, wide);
        if (g->b.glu)  /* the up projection's rows of the chunk after its gate's */
            g->b.widen->blocks(g->b.widen->weight, (g->b.n_out + w0) / 16, (w1 - w0) / 16,
                               (uint16_t *)((uint8_t *)wide + (w1 - w0) * g->b.row_bytes));
        widened = *g;
        widened.b.packed = (const uint8_t *)wide - w0 * g->b.row_bytes;
        widened.b.up_rows = w1 - w0;
        g = &widened;
    }
    const b_side_t *b = &g->b;
    const int64_t r0 = g->by_cols ? 0 : g->row_blocks * chunk / g->chunks;
    const int64_t r1 = g->by_cols ? g->row_blocks : g->row_blocks * (chunk + 1) / g->chunks;
    const int cols_outer = g->cols_outer;
    const int64_t outer = cols_outer ? c1 - c0 : r1 - r0, inner = cols_outer ? r1 - r0 : c1 - c0;
    const int64_t k_steps = g->k_steps;
    prefetch_t ahead[2] = {{NULL, 0}, {NULL, 0}};
    if (g->by_cols && !cols_outer && following < g->chunks && !b->widen)
        block_weights(b, following * g->chunk_blocks, g->chunk_blocks, ahead);
    const int64_t ahead_per_step = prefetch_per_step(ahead[0], outer * inner * k_steps);
    /* a prompt's rows outer: each thread starts at its own share of the row blocks and goes
     * round, so that the two read other rows of A, and fetches its next row block's to L2 over
     * the current one's k-steps. A was just written by the kernel before, partly on the other
     * core, and the first k-steps of each row block waited for it (a 512-token prefill's
     * linears in the C forward: 45.3-46.1 -> 43.3-44.0 ms) */
    const int spread = g->by_cols && !cols_outer && outer > COLS_OUTER_ROW_BLOCKS;
    const int64_t first_row = spread ? omp_get_thread_num() * outer / g->threads : 0;
    for (int64_t i = 0; i < outer; i++) {
        prefetch_t next[2] = {ahead[0], ahead[1]};
        if (cols_outer) {  /* the next output block's weights (widened already: in L2) */
            next[0] = next[1] = (prefetch_t){NULL, 0};
            if (c0 + i + 1 < c1 && !b->widen) block_weights(b, c0 + i + 1, 1, next);
        }
        const prefetch_t next_rows = spread ? row_block_lines(&g->a, r0 + (first_row + i + 1) % outer)
                                            : (prefetch_t){NULL, 0};
        const int64_t per_step = cols_outer ? prefetch_per_step(next[0], inner * k_steps) : ahead_per_step;
        for (int64_t j = 0; j < inner; j++) {
            const int64_t rb = cols_outer ? r0 + j : r0 + (first_row + i) % outer;
            const int64_t col = (cols_outer ? c0 + i : c0 + j) * block_outputs(b);
            const out_block_t o = {rb * 32, col, b->glu || col + 16 < b->n_out, rb * 32 + 16 < g->rows};
            const int64_t step0 = ((cols_outer ? 0 : i * inner) + j) * k_steps;
            const prefetch_run_t runs[3] = {
                {next[0], step0, per_step}, {next[1], step0, per_step},
                {next_rows, j * k_steps, prefetch_per_step(next_rows, inner * k_steps)}};
            const pending_t pending = last_block(g, p);
            block_products(g, o, i == 0 && (!cols_outer || j == 0), runs, &pending);
            store_tiles(p->c[p->count & 1], o);
            p->last = o;
            p->count++;
        }
    }
}

/* y [rows, N] (bf16; fp32 with y_elem 4) = x @ W^T on AMX tiles, for bf16 x and weights
 * (packed as pack_bf16_vnni) or int8 ones (flags GEMM_INT8; dynamic_linear.c's
 * [N/16][K/4][16][4]): both are 64 bytes per row of a k-step and per output of a B tile row.
 * GEMM_WIDEN: packed is a widen_t, whose weight each thread widens (row_bytes: the bf16 rows')
 * a chunk at a time into a buffer of its own (a GLU's gate rows, then its up rows); returns -2
 * when a thread's buffer could not be allocated.
 * int8 sums are exact int32. With row_scale (and col_scale) given, y = sum * row_scale[r] *
 * col_scale[c] (W8A8, FP8_DYNAMIC). Blocks of 32 rows (two A tiles) by 32 outputs (two B
 * tiles), four C tiles each. With GEMM_GLU, W (col_scale, bias) holds 2N rows, a gate's and an
 * up projection's, and y = silu(x W_gate^T) * (x W_up^T), each product first rounded to bf16
 * as y would be: a block is 16 outputs, its B tiles the gate's and the up projection's (see
 * bf16_glu).
 *
 * Cache blocking: the output blocks are cut into column chunks (row ranges, when there are
 * fewer output blocks than threads) whose weights fit in half of an L2, and a thread walks a
 * chunk rows outer, outputs inner: the chunk's weights are read from memory once and then from
 * L2, each row block's A tiles from L1. (Rows inner, as before, re-read all of A for every
 * output block: 2.4 MB of L3 traffic per block at 2,048 prompt tokens, half oneDNN's speed.)
 * Chunks go to threads dynamically: on this VM one core is often slowed by a neighbour, and a
 * static split then ran at the slow core's pace (1.5-1.8x slower at 512-2,048 rows in such
 * minutes). An odd last output block computes its B tile twice and keeps one. */
int amx_gemm(const void *x, int64_t x_stride, int64_t rows, const void *packed, int64_t row_bytes,
             int flags, const float *row_scale, const float *col_scale, const uint16_t *bias,
             void *y, int y_elem, int64_t n_out) {
    gemm_plan_t g = {.a = {(const uint8_t *)x, NULL, x_stride, 0, row_bytes},
                     .b = {flags & GEMM_WIDEN ? NULL : (const uint8_t *)packed, row_bytes, n_out,
                           n_out, flags & GEMM_GLU, flags & GEMM_WIDEN ? (const widen_t *)packed : NULL},
                     .rows = rows, .k_steps = row_bytes / 64, .threads = omp_get_max_threads(),
                     .int8 = flags & GEMM_INT8, .y_elem = y_elem, .row_scale = row_scale,
                     .col_scale = col_scale, .bias = bias, .y = y};
    if (pad_tail(&g.a, rows)) return -2;
    g.row_blocks = (rows + 31) / 32;
    g.col_blocks = (n_out + block_outputs(&g.b) - 1) / block_outputs(&g.b);
    /* column chunks handed out dynamically, about CHUNKS_PER_THREAD each, so that a thread the
     * VM slows down does not hold the other at the barrier; a chunk's weights fit in L2 */
    const int64_t fit = L2_BUDGET_BYTES / (32 * row_bytes), cap = fit > 0 ? fit : 1;
    const int64_t even = (g.col_blocks + g.threads * CHUNKS_PER_THREAD - 1) / (g.threads * CHUNKS_PER_THREAD);
    g.by_cols = g.col_blocks >= g.threads;
    g.chunk_blocks = g.by_cols ? (even < cap ? even : cap) : g.col_blocks;
    g.chunks = g.by_cols ? (g.col_blocks + g.chunk_blocks - 1) / g.chunk_blocks : g.threads;
    /* a chunk goes rows outer (each row block's A tiles stay in L1 while the chunk's weights
     * come from L2), or for a decode batch of up to COLS_OUTER_ROW_BLOCKS row blocks, outputs
     * outer: a block's weights come from memory once for all its rows, and the next block's are
     * fetched to L2 over its k-steps (the 121 linears from memory at 32 / 48 / 64 rows: 11.6 /
     * 15.1 / 16.4-16.6 -> 11.1 / 14.1-14.2 / 15.7-15.9 ms). The embedded model's fp32 logits
     * once measured slower so (64 rows: 3.5 -> 4.5 ms) and were kept rows outer until
     * 2026-12-07, when outputs outer measured faster at every decode batch (builds alternated,
     * from memory: 17 / 48 / 64 rows 3.52 / 4.34 / 4.32 -> 2.62 / 3.48 / 3.56 ms; from the
     * caches 2.00 / 2.80 at 17 / 64 -> 1.29 / 2.41). */
    g.cols_outer = g.by_cols && g.row_blocks <= COLS_OUTER_ROW_BLOCKS;
    g.stream = streams_sums(y, y_elem, n_out);
    /* The rows' epilogue (scaling, rounding, stores) weighs more on int8 blocks, whose tile
     * products take half the time of bf16's: with it skipped (results wrong), a W8A8 512-token
     * prefill took 42.6 ms instead of 56, a bf16 one 57 instead of 65. So an int8 block asks for
     * its rows of y, for writing, over its k-steps, before its epilogue stores them: W8A8
     * prefills 55.2-55.3 -> 53.0-53.1 ms (builds alternated). Asked for in bf16 blocks too, the
     * bf16 prefill slowed by 0.4-2.3 ms in each of six alternations (65.3-67.8 -> 67.1-69.0). */
    g.claim_y = g.int8 && !g.stream;
    int64_t claimed = 0;  /* chunks handed out so far */
    int failed = 0;
#pragma omp parallel
    {
        uint16_t *wide = g.b.widen ? alloc_lines((size_t)(g.chunk_blocks * 32 * row_bytes)) : NULL;  /* a GLU's too */
        if (g.b.widen && !wide) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        amx_configure_tiles();
        gemm_pipe_t pipe;
        pipe.count = 0;
        /* a thread claims its next chunk as it starts one, so that going rows outer it can fetch
         * that chunk's weights to L2 over this one's k-steps: the first row block otherwise
         * waits on memory for every weight of the chunk */
        int64_t chunk = g.b.widen && !wide ? g.chunks : __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
        while (chunk < g.chunks) {
            const int64_t following = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
            gemm_chunk(&g, chunk, following, &pipe, wide);
            chunk = following;
        }
        const pending_t last = last_block(&g, &pipe);
        if (last.c) pending_rows(&last, &g, 0, 32);
        if (g.stream) _mm_sfence();  /* the streaming stores land before the caller reads y */
        _tile_release();
        free(wide);
    }
    free((void *)g.a.tail);
    return failed ? -2 : 0;
}
#endif

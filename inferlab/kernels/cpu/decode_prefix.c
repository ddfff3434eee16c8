/* Decode attention for a batch whose sequences share their first blocks (a system prompt, n
 * copies of one prompt: "cascade" attention), called by paged_decode_attention
 * (decode_attention.c). The prefix's keys and values are laid out once per KV head (prefill's
 * tiles), and the query rows of PREFIX_GROUP tokens at a time meet them as matrix products
 * instead of each token reading the prefix on its own. A group's scores stay in its thread's
 * scratch: the whole batch's, 2 MB a layer for 64 tokens of the embedded model, fell out of L2
 * and cost what the products saved. The products sum in the per-token kernels' order
 * (prefix_scores_tile; vnni_product's chains are values_tile's), and each token then carries on
 * from the end of the prefix as attend does, so its result is the same bits as alone. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "decode_tiles.h"
#include "kernels.h"

#ifdef __AVX512BF16__
/* Positions every listed sequence holds in the same blocks (a shared system prompt, n copies
 * of one prompt), a multiple of 16 and at most every sequence's length. */
int64_t shared_prefix(const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                      const int32_t *seqs, int64_t num_decodes, int64_t block_size) {
    int64_t blocks = seq_lens[seqs[0]] / block_size;
    const int32_t *first = block_tables + seqs[0] * table_stride;
    for (int64_t i = 1; i < num_decodes && blocks > 0; i++) {
        const int32_t *table = block_tables + seqs[i] * table_stride;
        int64_t same = 0;
        while (same < blocks && same < seq_lens[seqs[i]] / block_size && table[same] == first[same])
            same++;
        blocks = same;
    }
    return blocks * block_size / 16 * 16;
}

#define PREFIX_LAYOUT_POSITIONS 128  /* a task of laying out the prefix (a multiple of 32) */

int64_t prefix_tile_bytes(int64_t shared, int64_t dim) {
    return round_up((int64_t)head_tile_bytes(shared, dim), 64);
}

/* The prefix's (positions [0, prefix.len) of prefix.table) keys and values as layout_head's
 * tiles, prefix_tile_bytes apart by KV head, in tasks of PREFIX_LAYOUT_POSITIONS shared out
 * among the threads of the enclosing parallel region (all of which must call it). */
void layout_prefix(const uint16_t *k_cache, const uint16_t *v_cache, span_t prefix, uint8_t *tiles) {
    const int64_t parts = (prefix.len + PREFIX_LAYOUT_POSITIONS - 1) / PREFIX_LAYOUT_POSITIONS;
    const int64_t tile_bytes = prefix_tile_bytes(prefix.len, prefix.dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < prefix.num_kv_heads * parts; task++) {
        const int64_t h = task / parts, p_lo = task % parts * PREFIX_LAYOUT_POSITIONS;
        layout_head(k_cache, v_cache, prefix, h, tiles + h * tile_bytes, p_lo,
                    p_lo + PREFIX_LAYOUT_POSITIONS);
    }
}

/* Tokens a task: 8 left the two threads unevenly loaded (4% slower), 2 wasted tile rows. */
#define PREFIX_GROUP 4

/* The scratch floats of one group: query rows (bf16), scores, sums and totals, by KV head. */
static int64_t group_scratch_floats(span_t s) {
    const int64_t rows = s.num_kv_heads * round_up(PREFIX_GROUP * s.group, 4);
    return rows * (s.dim / 2 + row_floats(s.len) + s.dim + 1);
}

/* Tokens [first, first + count) of paged_decode_attention's list (rows, seqs) against the
 * prefix's tiles (tile_bytes a KV head) and then their own positions. Rows by KV head: row
 * i * group + g of head h is token first + i's query head h * group + g. s: every field but
 * the table, len the longest sequence's. */
static void prefix_group(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                         const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                         const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                         int64_t first, int64_t count, uint16_t *out, const uint8_t *tiles,
                         int64_t tile_bytes, span_t s, int64_t shared, float scale, float *scratch) {
    const int64_t H = s.num_kv_heads, dim = s.dim, stride = row_floats(s.len);
    const int64_t rows_h = round_up(PREFIX_GROUP * s.group, 4), live = count * s.group;
    uint16_t *qbuf = (uint16_t *)scratch;
    float *scores = scratch + H * rows_h * dim / 2, *acc = scores + H * rows_h * stride;
    float *total = acc + H * rows_h * dim;
    memset(qbuf, 0, sizeof(uint16_t) * (size_t)(H * rows_h * dim));  /* rows past `live`: zeros */
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < count; i++)
            memcpy(qbuf + (h * rows_h + i * s.group) * dim, q + rows[first + i] * q_stride + h * s.group * dim,
                   sizeof(uint16_t) * (size_t)(s.group * dim));
    for (int64_t h = 0; h < H; h++)
        prefix_scores(qbuf + h * rows_h * dim, round_up(live, 4), (const uint32_t *)(tiles + h * tile_bytes),
                      shared, dim, scale, scores + h * rows_h * stride, stride);
    for (int values = 0; values < 2; values++) {
        if (values)  /* the prefix's sums, then each token's own positions' */
            for (int64_t h = 0; h < H; h++) {
                const uint16_t *vp = (const uint16_t *)(tiles + h * tile_bytes + key_tile_bytes(shared, dim));
                float *ah = acc + h * rows_h * dim;
                vnni_product((const uint16_t *)(scores + h * rows_h * stride), stride * 2, live,
                             shared / 2, vp, 512, 32, dim / 16 * 512, dim / 16, ah, dim);
                for (int64_t r = 0; r < live; r++) reorder_pairs(ah + r * dim, dim, 1);
            }
        for (int64_t i = 0; i < count; i++) {
            span_t token = s;
            token.table = block_tables + seqs[first + i] * table_stride;
            token.len = seq_lens[seqs[first + i]];
            rows_t w = {scores + i * s.group * stride, acc + i * s.group * dim, total + i * s.group,
                        stride, rows_h};
            attend_part(q + rows[first + i] * q_stride, k_cache, v_cache, token, scale, shared, w,
                        out + rows[first + i] * H * s.group * dim, values);
        }
    }
}

/* The batch's first `shared` positions (shared_prefix) laid out once per KV head, in tasks of
 * PREFIX_LAYOUT_POSITIONS, then groups of tokens as tasks. s: every field but the table, len the
 * longest sequence's. Returns 0, or -1 out of memory. */
int decode_with_prefix(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                       const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                       const int32_t *seq_lens, const int32_t *rows, const int32_t *seqs,
                       int64_t num_decodes, uint16_t *out, span_t s, int64_t shared, float scale) {
    const int64_t tile_bytes = prefix_tile_bytes(shared, s.dim);
    uint8_t *tiles = alloc_lines((size_t)(s.num_kv_heads * tile_bytes));
    if (!tiles) return -1;
    span_t prefix = s;
    prefix.table = block_tables + seqs[0] * table_stride;
    prefix.len = shared;
    int failed = 0;
#pragma omp parallel reduction(+ : failed)
    {
        layout_prefix(k_cache, v_cache, prefix, tiles);
        float *scratch = alloc_lines(sizeof(float) * (size_t)group_scratch_floats(s));
        failed += scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t first = 0; first < num_decodes; first += PREFIX_GROUP) {
            const int64_t count = num_decodes - first < PREFIX_GROUP ? num_decodes - first : PREFIX_GROUP;
            if (scratch)
                prefix_group(q, q_stride, k_cache, v_cache, block_tables, table_stride, seq_lens,
                             rows, seqs, first, count, out, tiles, tile_bytes, s, shared, scale, scratch);
        }
        free(scratch);
    }
    free(tiles);
    return failed ? -1 : 0;
}
#endif

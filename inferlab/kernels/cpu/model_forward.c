/* A Llama model's forward for a batch of any mix of prompts (or chunks of them) and decode tokens,
 * bf16, linears packed for matmul.c or quant_linear.c: the same kernels in the same order as the
 * Python layer (inferlab/models/llama.py, inferlab/kernels/attention/cpu_paged.py) calls them, so
 * the results are identical, without the ~200 us of Python and ctypes between them that a layer
 * costs otherwise (about 6 ms of a 27 ms decode step of the embedded model at one token, ~5 ms of
 * a 512-token prefill). One pair is fused where AMX tiles run it: the gate_up linear and
 * silu_and_mul (glu_forward, the same bits; a 64-token decode step 47.2-47.9 -> 45.3-45.7 ms).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)  /* linear_forward: quant_linear.c */
typedef struct {
    const uint16_t *input_norm, *post_norm;  /* [H] */
    linear_t qkv, o, gate_up, down;
    void *k_cache, *v_cache;  /* [blocks, block_size, Hkv, D] */
} layer_weights_t;

/* The layer's attention over qkv's rows (q and k roped, k and v written to the cache) into attn
 * [M, Hq * D]: the decode rows, then the prompts. Returns 0, or -1 out of memory. */
static int attention(const uint16_t *qkv, int64_t qkv_width, const layer_weights_t *w,
                     const forward_batch_t *b, uint16_t *attn) {
    int status = 0;
    if (b->num_decodes)
        status = paged_decode_attention(qkv, qkv_width, w->k_cache, w->v_cache, b->block_tables,
                                        b->table_stride, b->seq_lens, b->decode_rows, b->decode_seqs,
                                        b->num_decodes, attn, b->num_heads, b->num_kv_heads,
                                        b->head_dim, b->block_size, b->scale, 2);
    if (!status && b->num_prefills)
        status = paged_prefill_attention(qkv, qkv_width, w->k_cache, w->v_cache, b->block_tables,
                                         b->table_stride, b->query_start_loc, b->seq_lens,
                                         b->prefill_seqs, b->num_prefills, attn, b->num_heads,
                                         b->num_kv_heads, b->head_dim, b->block_size, b->scale);
    return status ? -1 : 0;
}

/* One layer. x [M, H]: in, the previous layer's MLP output (layer 0: the embeddings); out,
 * this layer's. residual [M, H]: the stream before x, in and out (layer 0: written). qkv: the
 * scratch model_forward allocates. Returns 0, or -1 / -2 when attention / a matmul could not
 * allocate its scratch memory. */
static int one_layer(uint16_t *x, uint16_t *residual, int first_layer, int64_t rows,
                     const layer_weights_t *w, const forward_batch_t *b, uint16_t *qkv) {
    const int64_t q_size = b->num_heads * b->head_dim, kv_size = b->num_kv_heads * b->head_dim;
    const int64_t qkv_width = q_size + 2 * kv_size, hidden = b->hidden;
    uint16_t *attn = qkv + rows * qkv_width, *gate_up = attn + rows * q_size;
    uint16_t *act = gate_up + rows * 2 * b->intermediate;

    if (first_layer) memcpy(residual, x, (size_t)rows * hidden * 2);
    rms_norm(x, hidden, first_layer ? NULL : residual, w->input_norm, x, rows, hidden, b->eps, 2);
    int failed = linear_forward(&w->qkv, x, hidden, rows, qkv) != 0;
    rotary(qkv, qkv_width, b->num_heads + b->num_kv_heads, b->positions, b->cos_table,
           b->sin_table, rows, b->head_dim, 2);  /* q and k side by side */
    write_kv(qkv + q_size, qkv_width, qkv + q_size + kv_size, qkv_width, b->slots, w->k_cache,
             w->v_cache, rows, kv_size, 2);
    int status = attention(qkv, qkv_width, w, b, attn);
    failed |= linear_forward(&w->o, attn, q_size, rows, x) != 0;
    rms_norm(x, hidden, residual, w->post_norm, x, rows, hidden, b->eps, 2);
    failed |= glu_forward(&w->gate_up, x, hidden, rows, gate_up, act) != 0;
    failed |= linear_forward(&w->down, act, b->intermediate, rows, x) != 0;
    return failed ? -2 : status;
}

/* The model's forward in one call from Python (a ctypes call costs microseconds once a step's
 * weights have flushed the caches): the token ids' embeddings, the decoder layers
 * layers[0 .. num_layers) in order, the final norm. out [M, H]: the final hidden states;
 * residual [M, H]: scratch. Returns 0; -1 / -2 when attention / a matmul or this function
 * could not allocate its scratch memory (the layers after it are then not run); -3 for a
 * token id outside the embedding table (nothing run). */
int model_forward(uint16_t *out, uint16_t *residual, int64_t rows, const layer_weights_t *layers,
                  int64_t num_layers, const forward_batch_t *batch) {
    for (int64_t m = 0; m < rows; m++)
        if (batch->token_ids[m] < 0 || batch->token_ids[m] >= batch->vocab) return -3;
    embed_rows(batch, rows, out, 2, 16, 2);
    const int64_t q_size = batch->num_heads * batch->head_dim;
    const int64_t kv_size = batch->num_kv_heads * batch->head_dim;
    size_t elems = (size_t)rows * (q_size + 2 * kv_size + q_size + 3 * batch->intermediate);
    uint16_t *qkv = alloc_lines(elems * 2);
    int status = qkv ? 0 : -2;
    for (int64_t layer = 0; layer < num_layers && !status; layer++)
        status = one_layer(out, residual, layer == 0, rows, layers + layer, batch, qkv);
    free(qkv);
    if (!status)
        rms_norm(out, batch->hidden, residual, batch->final_norm, out, rows, batch->hidden,
                 batch->final_eps, 2);
    return status;
}

int has_model_forward(void) { return 1; }
#else
int has_model_forward(void) { return 0; }
#endif

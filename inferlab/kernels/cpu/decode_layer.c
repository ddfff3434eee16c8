/* A Llama model's decode forward for a batch of decode tokens (one new token per sequence), bf16,
 * linears packed for matmul.c or quant_linear.c: the same kernels in the same order as the Python layer
 * (inferlab/models/llama.py) calls them, so the results are identical, without the ~200 us of
 * Python and ctypes between them that a layer costs otherwise (about 6 ms of a 27 ms decode
 * step of the embedded model at one token).
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

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size, table_stride, vocab;
    float eps, final_eps, scale;
    const int64_t *token_ids, *positions, *slots;  /* [M] */
    const float *cos_table, *sin_table;  /* [P, D] */
    const int32_t *block_tables, *seq_lens;  /* [M, W], [M]: sequence i is row i */
    const uint16_t *embed, *final_norm;  /* [vocab, H], [H] */
} decode_batch_t;

/* One layer. x [M, H]: in, the previous layer's MLP output (layer 0: the embeddings); out,
 * this layer's. residual [M, H]: the stream before x, in and out (layer 0: written). qkv: the
 * scratch decode_model allocates. Returns 0, or -1 / -2 when attention / a matmul could not
 * allocate its scratch memory. */
static int one_layer(uint16_t *x, uint16_t *residual, int first_layer, int64_t rows,
                     const layer_weights_t *w, const decode_batch_t *b, uint16_t *qkv,
                     const int32_t *index) {
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
    int status = paged_decode_attention(qkv, qkv_width, w->k_cache, w->v_cache, b->block_tables,
                                        b->table_stride, b->seq_lens, index, index, rows, attn,
                                        b->num_heads, b->num_kv_heads, b->head_dim, b->block_size,
                                        b->scale, 2);
    failed |= linear_forward(&w->o, attn, q_size, rows, x) != 0;
    rms_norm(x, hidden, residual, w->post_norm, x, rows, hidden, b->eps, 2);
    failed |= linear_forward(&w->gate_up, x, hidden, rows, gate_up) != 0;
    silu_and_mul(gate_up, act, rows, b->intermediate, 2);
    failed |= linear_forward(&w->down, act, b->intermediate, rows, x) != 0;
    return failed ? -2 : status;
}

/* The model's decode forward in one call from Python (a ctypes call costs microseconds once a
 * step's weights have flushed the caches): the token ids' embeddings, the decoder layers
 * layers[0 .. num_layers) in order, the final norm. out [M, H]: the final hidden states;
 * residual [M, H]: scratch. Returns 0; -1 / -2 when attention / a matmul or this function
 * could not allocate its scratch memory (the layers after it are then not run); -3 for a
 * token id outside the embedding table (nothing run). */
int decode_model(uint16_t *out, uint16_t *residual, int64_t rows, const layer_weights_t *layers,
                 int64_t num_layers, const decode_batch_t *b) {
    for (int64_t m = 0; m < rows; m++)
        if (b->token_ids[m] < 0 || b->token_ids[m] >= b->vocab) return -3;
    for (int64_t m = 0; m < rows; m++)
        memcpy(out + m * b->hidden, b->embed + b->token_ids[m] * b->hidden, (size_t)b->hidden * 2);
    const int64_t q_size = b->num_heads * b->head_dim, kv_size = b->num_kv_heads * b->head_dim;
    size_t elems = (size_t)rows * (q_size + 2 * kv_size + q_size + 3 * b->intermediate);
    uint16_t *qkv = malloc(elems * 2);
    int32_t *index = malloc(sizeof(int32_t) * (size_t)rows);
    int status = qkv && index ? 0 : -2;
    for (int64_t i = 0; i < rows && index; i++) index[i] = (int32_t)i;
    for (int64_t layer = 0; layer < num_layers && !status; layer++)
        status = one_layer(out, residual, layer == 0, rows, layers + layer, b, qkv, index);
    free(qkv);
    free(index);
    if (!status)
        rms_norm(out, b->hidden, residual, b->final_norm, out, rows, b->hidden, b->final_eps, 2);
    return status;
}

int has_decode_layer(void) { return 1; }
#else
int has_decode_layer(void) { return 0; }
#endif

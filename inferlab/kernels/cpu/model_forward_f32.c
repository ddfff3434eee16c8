/* A Llama model's forward in one call for fp32 decode batches on AVX2 + FMA, its linears run by
 * avx2_quant_linear.c (dense fp32, W8A16, W4A16, W8A8): the kernels the Python layer
 * (inferlab/models/llama.py) calls, in its order, so the outputs are identical, without the
 * Python, tensor views and ctypes between them (perf had put a fifth of a single-sequence step's
 * samples in libgomp's waits, the threads idle while Python ran): on an AMD EPYC Zen 3 the
 * embedded model's single-sequence step went from 40-46 to 21-23 ms, a 64-sequence one from
 * 240-250 to 191-211. Prompts are not taken: their attention is torch's SDPA in fp32 (no C
 * kernel), and a prompt step is long enough that the Python between its kernels costs little.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
typedef struct {
    const float *input_norm, *post_norm;  /* [H] */
    avx2_qlinear_t qkv, o, gate_up, down;
    float *k_cache, *v_cache;  /* [blocks, block_size, Hkv, D] */
} f32_layer_t;

/* One layer over decode rows. x [M, H]: in, the previous layer's MLP output (layer 0: the
 * embeddings); out, this layer's. residual [M, H]: the stream before x, in and out (layer 0:
 * written). qkv: scratch for the layer's activations. Returns 0, or -1 / -2 when attention / a
 * W8A8 linear could not allocate its scratch memory. */
static int one_layer_f32(float *x, float *residual, int first_layer, int64_t rows,
                         const f32_layer_t *w, const forward_batch_t *b, float *qkv) {
    const int64_t q_size = b->num_heads * b->head_dim, kv_size = b->num_kv_heads * b->head_dim;
    const int64_t qkv_width = q_size + 2 * kv_size, hidden = b->hidden;
    float *attn = qkv + rows * qkv_width, *gate_up = attn + rows * q_size;
    float *act = gate_up + rows * 2 * b->intermediate;

    if (first_layer) memcpy(residual, x, (size_t)rows * hidden * 4);
    rms_norm(x, hidden, first_layer ? NULL : residual, w->input_norm, x, rows, hidden, b->eps, 4);
    int failed = avx2_quant_linear(&w->qkv, x, hidden, rows, qkv) != 0;
    rotary(qkv, qkv_width, b->num_heads + b->num_kv_heads, b->positions, b->cos_table,
           b->sin_table, rows, b->head_dim, 4);  /* q and k side by side */
    write_kv(qkv + q_size, qkv_width, qkv + q_size + kv_size, qkv_width, b->slots, w->k_cache,
             w->v_cache, rows, kv_size, 4);
    const int status = paged_decode_attention(
        qkv, qkv_width, w->k_cache, w->v_cache, b->block_tables, b->table_stride, b->seq_lens,
        b->decode_rows, b->decode_seqs, b->num_decodes, attn, b->num_heads, b->num_kv_heads,
        b->head_dim, b->block_size, b->scale, 4);
    failed |= avx2_quant_linear(&w->o, attn, q_size, rows, x) != 0;
    rms_norm(x, hidden, residual, w->post_norm, x, rows, hidden, b->eps, 4);
    failed |= avx2_quant_linear(&w->gate_up, x, hidden, rows, gate_up) != 0;
    silu_and_mul(gate_up, act, rows, b->intermediate, 4);
    failed |= avx2_quant_linear(&w->down, act, b->intermediate, rows, x) != 0;
    return failed ? -2 : status ? -1 : 0;
}

/* model_forward for fp32 rows that are all decode tokens (num_prefills 0, decode_rows and
 * decode_seqs given). out [M, H]: the final hidden states; residual [M, H]: scratch. Returns 0;
 * -1 / -2 when attention / a linear or this function could not allocate its scratch memory (the
 * layers after it are then not run); -3 for a token id outside the embedding table, -4 for a batch with
 * prompts (nothing run either way). */
int model_forward_f32(float *out, float *residual, int64_t rows, const f32_layer_t *layers,
                      int64_t num_layers, const forward_batch_t *b) {
    if (b->num_prefills || b->num_decodes != rows || !b->decode_rows || !b->decode_seqs) return -4;
    for (int64_t m = 0; m < rows; m++)
        if (b->token_ids[m] < 0 || b->token_ids[m] >= b->vocab) return -3;
    if (b->embed_codes) avx2_quant_rows(b->embed_codes, b->token_ids, rows, out);
    else embed_rows(b, rows, out, 4, 8, 1);
    const int64_t q_size = b->num_heads * b->head_dim, kv_size = b->num_kv_heads * b->head_dim;
    float *qkv = alloc_lines(sizeof(float) * (size_t)rows * (2 * q_size + 2 * kv_size + 3 * b->intermediate));
    int status = qkv ? 0 : -2;
    for (int64_t layer = 0; layer < num_layers && !status; layer++)
        status = one_layer_f32(out, residual, layer == 0, rows, layers + layer, b, qkv);
    free(qkv);
    if (!status) rms_norm(out, b->hidden, residual, b->final_norm, out, rows, b->hidden, b->final_eps, 4);
    return status;
}

int has_model_forward_f32(void) { return 1; }
#else
int has_model_forward_f32(void) { return 0; }
#endif

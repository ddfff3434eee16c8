"""The one-call C model forward gives exactly what the Python layers give: in bf16 for decode
tokens, prompts, chunks of prompts after cached positions, and batches mixing them; in fp32
(AVX2 linears) for decode batches, the others left to the Python layers."""

from __future__ import annotations

import sys

import pytest
import torch

from inferlab.kernels import cpu_model, cpu_ops
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.avx2_fp32_linear import (
    Avx2Fp32Linear,
    avx2_fp32_fits,
    avx2_fp32_linear_supported,
    use_avx2_fp32_linears,
)
from inferlab.kernels.cpu_linear import (
    PackedEmbedding,
    packed_linear_supported,
    replace_linears_keeping_ties,
    use_packed_linears,
)
from inferlab.models.config import ModelConfig
from inferlab.models.llama import LlamaForCausalLM
from inferlab.quant import linear_dynamic
from inferlab.quant.layer import LINEARS
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import INT, ActivationArgs, QuantScheme, WeightArgs, make_scheme
from tests.kernels.gguf_values import gguf_file_blocks

CPU = torch.device("cpu")
BF16 = pytest.mark.skipif(
    not (packed_linear_supported(CPU, torch.bfloat16) and cpu_ops.model_forward_available(torch.bfloat16)),
    reason="this CPU (or its compiler) has no AVX512-BF16 kernels")
F32 = pytest.mark.skipif(
    not (avx2_fp32_linear_supported(CPU, torch.float32) and cpu_ops.model_forward_available(torch.float32)),
    reason="this CPU (or its compiler) has no AVX2 + FMA kernels")
DTYPES = [pytest.param(torch.bfloat16, marks=BF16, id="bf16"), pytest.param(torch.float32, marks=F32, id="fp32")]

BLOCK = 16


def tiny_model(head_dim: int, bias: bool, pack: bool = True, tied: bool = False,
               dtype: torch.dtype = torch.bfloat16) -> LlamaForCausalLM:
    cfg = ModelConfig(architecture="Qwen2ForCausalLM" if bias else "LlamaForCausalLM",
                      vocab_size=256, hidden_size=128, intermediate_size=192, num_layers=3,
                      num_heads=128 // head_dim * 2, num_kv_heads=128 // head_dim,
                      head_dim=head_dim, max_position_embeddings=512, attention_bias=bias,
                      tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model = model.to(dtype).eval()
    if pack:
        (use_packed_linears if dtype == torch.bfloat16 else use_avx2_fp32_linears)(model)
    return model


def random_batch(model, context_lens: list[int], query_lens: list[int] | None, seed: int):
    """Sequences of context_lens[b] cached positions and query_lens[b] new tokens (1 each when
    None: a decode batch), their blocks in a random order over random caches."""
    cfg = model.config
    query_lens = query_lens or [1] * len(context_lens)
    gen = torch.Generator().manual_seed(seed)
    need = [-(-(c + q) // BLOCK) for c, q in zip(context_lens, query_lens, strict=True)]
    order = torch.randperm(sum(need) + 3, generator=gen).tolist()
    tables, start = [], 0
    for n in need:
        tables.append(order[start:start + n])
        start += n
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, BLOCK)
    shape = (len(order), BLOCK, cfg.num_kv_heads, cfg.head_dim)
    dtype = model.model.norm.weight.dtype
    caches = [(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
              for _ in range(cfg.num_layers)]
    ids = torch.randint(0, cfg.vocab_size, (sum(query_lens),), generator=gen)
    positions = torch.cat([torch.arange(c, c + q) for c, q in zip(context_lens, query_lens, strict=True)])
    return ids, positions, caches, meta


BATCHES = {  # (cached positions, new tokens) of each sequence
    "one decode": ([40], None), "decodes": ([3, 130, 17, 0, 64], None), "9 decodes": ([200] * 9, None),
    "a prompt": ([0], [37]), "a chunk after cached positions": ([48], [70]),
    "decodes, chunks and prompts": ([40, 100, 0, 7, 0], [1, 23, 70, 1, 2]),
}


def forward_both_ways(model, batch, seed, monkeypatch):
    """(the hidden states and caches of the model's forward, whether the C path took it), and
    (the Python layers' hidden states and caches), from the same start."""
    ids, positions, caches, meta = random_batch(model, *batch, seed=seed)
    run_model, took = cpu_model.run_model, []
    with torch.no_grad(), monkeypatch.context() as patch:
        patch.setattr(cpu_model, "run_model", lambda *args: took.append(run_model(*args)) or took[-1])
        c_caches = [(k.clone(), v.clone()) for k, v in caches]
        ours = model(ids, positions, c_caches, meta)
        patch.setattr(cpu_model, "run_model", lambda *args: None)
        reference = model(ids, positions, caches, meta)
    return (ours, c_caches, took[0] is not None), (reference, caches)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "bias"), [(64, False), (32, True), (16, False), (12, False)])
@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_c_layers_equal_the_python_layers(dtype, head_dim, bias, batch, monkeypatch):
    model = tiny_model(head_dim, bias, dtype=dtype)  # head dim 12: fp32's generic attention loops
    (ours, c_caches, in_c), (reference, caches) = forward_both_ways(model, batch, len(batch[0]), monkeypatch)
    # the C path takes decode batches (bf16: not at head dim 12, whose o_proj's 240 inputs no
    # packed bf16 linear takes); prompts in bf16 where the prefill tiles fit (dims of 32s)
    linears_in_c = dtype == torch.float32 or head_dim != 12
    assert in_c == (linears_in_c and (batch[1] is None or (dtype == torch.bfloat16 and head_dim % 32 == 0)))
    assert torch.equal(ours, reference)
    assert all(torch.equal(a, b) for pair, ref in zip(c_caches, caches, strict=True)
               for a, b in zip(pair, ref, strict=True))


@BF16
def test_what_the_c_forward_does_not_take_keeps_the_python_layers():
    model = tiny_model(16, False)  # head dim 16: no prefill tiles
    ids, positions, caches, meta = random_batch(model, [9, 0], [1, 5], seed=1)
    rope = (positions, model.model.rotary.cos, model.model.rotary.sin)
    assert cpu_model.run_model(model.model, ids, rope, caches, meta) is None
    ids, positions, caches, decodes = random_batch(model, [9, 4], None, seed=1)
    rope = (positions, model.model.rotary.cos, model.model.rotary.sin)
    assert cpu_model.run_model(model.model, ids, rope, caches, decodes) is not None
    assert cpu_model.run_model(model.model.float(), ids, rope, caches, decodes) is None


STATIC_W8A8 = QuantScheme("W8A8-static", WeightArgs(8), ActivationArgs(INT, static=True))


def quantize_linears(model, scheme_name: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """Each decoder linear replaced by the CPU layer its scheme builds from RTN codes; static
    input scales small enough that some inputs lie past them and clamp."""
    scheme = STATIC_W8A8 if scheme_name == STATIC_W8A8.name else make_scheme(scheme_name, 32)
    for layer in model.model.layers:
        for name in LINEARS:
            parent, _, leaf = name.rpartition(".")
            owner = layer.get_submodule(parent)
            dense = getattr(owner, leaf)
            qw = quantize_rtn(dense.weight.detach().float(), scheme.weights)
            if scheme.activations is not None and scheme.activations.static:
                qw.input_scale = torch.tensor([0.004])
            setattr(owner, leaf, build_quant_linear(qw, scheme.activations, dense.bias, dtype))


@F32
def test_fp32_prompts_and_linears_the_kernels_do_not_run_keep_the_python_layers():
    model = tiny_model(64, False, dtype=torch.float32)
    ids, positions, caches, meta = random_batch(model, [9, 0], [1, 5], seed=1)
    rope = (positions, model.model.rotary.cos, model.model.rotary.sin)
    assert cpu_model.run_model(model.model, ids, rope, caches, meta) is None  # a prompt
    ids, positions, caches, decodes = random_batch(model, [9, 4], None, seed=1)
    rope = (positions, model.model.rotary.cos, model.model.rotary.sin)
    assert cpu_model.run_model(model.model, ids, rope, caches, decodes) is not None
    model.model.layers[2].mlp.down_proj = torch.nn.Linear(192, 128)  # a plain fp32 linear
    assert cpu_model.run_model(model.model, ids, rope, caches, decodes) is None


def _stored_as(param: torch.Tensor, storage: str) -> torch.Tensor:
    """The values a checkpoint stored in `storage` (bf16, or a GGUF's Q4_1 / Q8_0 blocks for
    matrices) loads as in fp32."""
    if storage == "bf16":
        return param.to(torch.bfloat16).float()
    return gguf_file_blocks(param, storage)[1] if param.dim() == 2 else param


@F32
@pytest.mark.parametrize(("storage", "held"), [("bf16", torch.bfloat16), ("Q4_1", torch.uint8), ("Q8_0", torch.uint8)])
@pytest.mark.parametrize("batch_name", ["one decode", "decodes", "decodes, chunks and prompts"])
def test_an_fp32_model_held_in_fewer_bytes_gives_the_fp32_storage_bits(storage, held, batch_name, monkeypatch):
    """A bf16 checkpoint or a GGUF of Q4_1 / Q8_0 blocks run in fp32: its decoder linears narrow
    to bf16 or to the blocks' codes (exact), and the C forward and the Python layers give the
    bits the fp32-stored linears give."""
    narrow, wide = (tiny_model(64, True, pack=False, dtype=torch.float32) for _ in range(2))
    for model in (narrow, wide):
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(_stored_as(param, storage))
    use_avx2_fp32_linears(narrow)
    replace_linears_keeping_ties(wide, Avx2Fp32Linear, avx2_fp32_fits)  # without narrowing
    assert narrow.model.layers[0].mlp.down_proj.packed.dtype == held
    assert wide.model.layers[0].mlp.down_proj.packed.dtype == torch.float32
    (ours, _, _), (python_layers, _) = forward_both_ways(narrow, BATCHES[batch_name], 5, monkeypatch)
    (reference, _, _), _ = forward_both_ways(wide, BATCHES[batch_name], 5, monkeypatch)
    assert torch.equal(ours, reference) and torch.equal(python_layers, reference)


@F32
@pytest.mark.parametrize("scheme", ["W8A16", "W4A16", "W8A8", "W8A8-static", "FP8_DYNAMIC", "FP8"])
@pytest.mark.parametrize("contexts", [[40], [3, 130, 17, 0, 64], [5] * 33], ids=["1", "5", "33"])
def test_fp32_c_layers_with_quantized_linears_equal_the_python_layers(scheme, contexts, monkeypatch):
    """Up to the weight-only kernels' row limit (32) in C; past it those layers dequantize for
    oneDNN, so the whole batch keeps the Python layers. W8A8's and FP8's kernel takes any rows.
    W8A8 takes the AVX2 kernel even where oneDNN's int8 GEMM is exact (VNNI), which fp32 runs
    there instead."""
    monkeypatch.setattr(linear_dynamic, "onednn_int8_available", lambda: False)
    model = tiny_model(64, True, pack=False, dtype=torch.float32)
    quantize_linears(model, scheme, torch.float32)
    limit = 32 if scheme.startswith("W8A16") or scheme == "W4A16" else sys.maxsize
    assert all(m.kernel_max_rows == limit for layer in model.model.layers for m in cpu_model._linears(layer))
    (ours, _, in_c), (reference, _) = forward_both_ways(model, (contexts, None), 7, monkeypatch)
    assert in_c == (len(contexts) <= limit)
    assert torch.equal(ours, reference)


@BF16
@pytest.mark.skipif(not cpu_ops.dynamic_linear_available(), reason="no AVX512-VNNI kernels here")
@pytest.mark.parametrize("scheme", ["W8A16", "W4A16", "W8A8", "FP8_DYNAMIC", "FP8", "W8A8-static"])
@pytest.mark.parametrize("batch_name", ["one decode", "decodes", "decodes, chunks and prompts"])  # the kernels, > 4 rows, > 16
def test_c_layers_with_quantized_linears_equal_the_python_layers(scheme, batch_name, monkeypatch):
    model = tiny_model(64, False, pack=False)
    quantize_linears(model, scheme)
    (ours, _, in_c), (reference, _) = forward_both_ways(model, BATCHES[batch_name], 7, monkeypatch)
    assert in_c
    assert torch.equal(ours, reference)


@BF16
def test_a_linear_set_anew_after_a_step_is_the_one_the_next_step_runs(monkeypatch):
    model = tiny_model(64, False)
    ids, positions, caches, meta = random_batch(model, [40, 7], None, seed=3)
    ours_caches = [(k.clone(), v.clone()) for k, v in caches]  # the same pairs both steps
    with torch.no_grad():
        model(ids, positions, ours_caches, meta)  # plans the C path (rewrites only these slots)
        attn = model.model.layers[1].self_attn
        new_weight = torch.randn(attn.o_proj.out_features, attn.o_proj.in_features) * 0.05
        qw = quantize_rtn(new_weight, make_scheme("W8A16", 32).weights)
        attn.o_proj = build_quant_linear(qw, None, None, torch.bfloat16)
        ours = model(ids, positions, ours_caches, meta)
        monkeypatch.setattr(cpu_model, "run_model", lambda *args: None)
        reference = model(ids, positions, caches, meta)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_token_id_outside_the_embedding_table_is_an_error_not_a_read(dtype):
    model = tiny_model(64, False, dtype=dtype)
    ids, positions, caches, meta = random_batch(model, [40, 7], None, seed=5)
    ids[1] = model.config.vocab_size  # one past the table
    rope = (positions, model.model.rotary.cos, model.model.rotary.sin)
    with pytest.raises(IndexError, match="outside the embedding table"):
        cpu_model.run_model(model.model, ids, rope, caches, meta)


@pytest.mark.parametrize(("dtype", "storage"), [pytest.param(torch.bfloat16, None, marks=BF16, id="bf16"),
                                               pytest.param(torch.float32, None, marks=F32, id="fp32"),
                                               pytest.param(torch.float32, "Q8_0", marks=F32, id="fp32-Q8_0"),
                                               pytest.param(torch.float32, "Q4_1", marks=F32, id="fp32-Q4_1")])
def test_a_tied_embedding_is_read_from_the_packed_head_and_held_once(dtype, storage, monkeypatch):
    """Its rows are the embedding's, through the Python lookup and the C forward's alike (the C
    forward of the same model with a row-major table in its place gives the same bits); a
    GGUF's Q8_0 table (the embedded model's) or Q4_1 one run in fp32 is held once, as the head's
    codes."""
    model = tiny_model(64, False, pack=False, tied=True, dtype=dtype)
    if storage:
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(_stored_as(param, storage))
    table = model.model.embed_tokens.weight.detach().clone()
    (use_packed_linears if dtype == torch.bfloat16 else use_avx2_fp32_linears)(model)
    embedding = model.model.embed_tokens
    assert isinstance(embedding, PackedEmbedding)
    assert embedding.packed.data_ptr() == model.lm_head.packed.data_ptr()
    assert model.lm_head.packed.dtype == (torch.uint8 if storage else dtype)  # codes, or the table
    assert not any(t.shape == table.shape for t in [*model.parameters(), *model.buffers()])
    ids = torch.tensor([[0, 17, 255], [16, 15, 31]])
    assert torch.equal(embedding(ids), table[ids])
    batch = BATCHES["decodes, chunks and prompts" if dtype == torch.bfloat16 else "decodes"]
    (packed, _, in_c), _ = forward_both_ways(model, batch, 3, monkeypatch)
    assert in_c
    model.model.embed_tokens = torch.nn.Embedding.from_pretrained(table)
    (row_major, _, in_c), _ = forward_both_ways(model, batch, 3, monkeypatch)
    assert in_c
    assert torch.equal(packed, row_major)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("token", [-1, 256])
def test_a_packed_embedding_refuses_a_token_outside_its_table(dtype, token):
    model = tiny_model(64, False, tied=True, dtype=dtype)
    with pytest.raises(IndexError, match=r"outside the embedding table \(0\.\.255\)"):
        model.model.embed_tokens(torch.tensor([3, token]))

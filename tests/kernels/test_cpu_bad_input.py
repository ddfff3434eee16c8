"""The C kernels' entry points on input they cannot take as it is: an empty batch, non-finite
activations, values past a static scale, and tensors that do not fit the layout a kernel reads.
Each gives what torch gives (an empty result, NaN, a clamped code) or a ValueError, never a
crash, a write past a buffer or finite numbers that are wrong."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention import cpu_paged
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.cpu_linear import PackedLinear, packed_linear_supported
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.qparams import QuantizedWeight, quantize_rtn
from inferlab.quant.scheme import INT, ActivationArgs, make_scheme

BF16 = torch.bfloat16
pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), BF16),
                                reason="this CPU (or its compiler) has no AVX512-BF16 kernel")


def c_layer(scheme_name: str, n_out: int = 64, k_in: int = 256) -> nn.Module:
    torch.manual_seed(0)
    scheme = make_scheme(scheme_name, 64)
    qw = quantize_rtn(torch.randn(n_out, k_in) * 0.05, scheme.weights)
    layer = build_quant_linear(qw, scheme.activations, None, BF16)
    assert type(layer).__name__.startswith("Packed"), type(layer).__name__  # the C kernel
    return layer


def test_a_bf16_linear_of_no_rows_is_empty():
    layer = PackedLinear(nn.Linear(256, 64).to(BF16))
    assert layer(torch.randn(0, 256).to(BF16)).shape == (0, 64)


# 1 row: the register kernels; 20: AMX tiles where the CPU has them
@pytest.mark.parametrize("rows", [1, 20])
@pytest.mark.parametrize("scheme", ["W8A16", "W4A16", "W8A8", "FP8_DYNAMIC"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_activation_makes_its_row_nan_and_only_its_row(scheme, rows, bad):
    layer = c_layer(scheme)
    torch.manual_seed(1)
    x = torch.randn(rows, 256).to(BF16)
    clean = layer(x)
    x[0, 5] = bad
    y = layer(x)
    assert bool(y[0].isnan().all()), y[0, :4]
    assert torch.equal(y[1:], clean[1:])


def test_a_static_scale_clamps_values_past_it_with_their_sign():
    torch.manual_seed(0)
    scheme = make_scheme("W8A8")
    qw = quantize_rtn(torch.randn(32, 64) * 0.05, scheme.weights)
    qw = QuantizedWeight(qw.codes, qw.scale, None, qw.args, torch.tensor([0.01]))
    ours = build_quant_linear(qw, ActivationArgs(INT, static=True), None, BF16)
    x = torch.zeros(3, 64).to(BF16)
    x[:, 0] = torch.tensor([2.0, 3e7, float("inf")])  # each clamps to code 127
    y = ours(x)
    assert torch.equal(y[1], y[0]) and torch.equal(y[2], y[0])
    clamped = 127 * 0.01 * qw.codes[:, 0].float() * qw.scale[:, 0].float()
    assert torch.allclose(y[0].float(), clamped, rtol=2 ** -8, atol=0)


def _attention_case(num_heads: int = 6, num_kv_heads: int = 3):
    torch.manual_seed(0)
    caches = [torch.randn(8, 16, num_kv_heads, 64).to(BF16) for _ in range(2)]
    meta = AttentionMetadata.build([20], [20], [[1, 2]], 16)
    q = torch.randn(20, num_heads, 64).to(BF16)
    kv = [torch.randn(20, num_kv_heads, 64).to(BF16) for _ in range(2)]
    return q, kv, caches, meta


def test_prefill_attention_refuses_heads_that_do_not_group():
    q, (k, v), (kc, vc), meta = _attention_case(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="6 query heads do not group over 4 KV heads"):
        cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)


def _prefill_args(q, caches, meta):
    return dict(q=q, k_cache=caches[0], v_cache=caches[1], block_tables=meta.block_tables,
                query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens,
                seqs=torch.tensor([0], dtype=torch.int32), scale=0.125, out=torch.empty_like(q))


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(seq_lens=a["seq_lens"].long()), "index tensors must be int32"),
    (lambda a: a.update(block_tables=a["block_tables"].long()), "index tensors must be int32"),
    (lambda a: a.update(q=a["q"].float(), out=a["out"].float()), "share one dtype"),
    (lambda a: a.update(v_cache=a["v_cache"].transpose(0, 1).contiguous().transpose(0, 1)),
     "unexpected tensor layout"),
    (lambda a: a.update(q=a["q"][..., :32].contiguous(), out=a["out"][..., :32].contiguous()),
     r"q \(\d+, 6, 32\) and out .* do not match the caches"),
    (lambda a: a.update(out=a["out"][:1]), "do not match the caches"),
], ids=["int64 lengths", "int64 block table", "fp32 q", "strided v cache", "head dim", "out rows"])
def test_prefill_attention_refuses_what_it_would_misread(change, message):
    q, _, caches, meta = _attention_case()
    args = _prefill_args(q, caches, meta)
    change(args)
    with pytest.raises(ValueError, match=message):
        cpu_ops.paged_prefill_attention(**args)


def test_decode_attention_refuses_other_dtypes_and_a_strided_v_cache():
    q, _, (kc, vc), meta = _attention_case()
    index = (meta.block_tables, meta.seq_lens, torch.tensor([0], dtype=torch.int32),
             torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="share one dtype"):
        cpu_ops.paged_decode_attention(q[:1].float(), kc, vc, *index, 0.125,
                                       torch.empty(1, 6, 64))
    strided = vc.transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match="unexpected tensor layout"):
        cpu_ops.paged_decode_attention(q[:1], kc, strided, *index, 0.125, torch.empty(1, 6, 64, dtype=BF16))


def test_a_slot_past_the_cache_is_refused_and_nothing_is_written():
    k = torch.ones(2, 3, 64).to(BF16)
    caches = [torch.zeros(4, 16, 3, 64).to(BF16) for _ in range(2)]
    with pytest.raises(ValueError, match="slot 64 is past the cache's 64 slots"):
        cpu_ops.write_kv(k, k, *caches, torch.tensor([3, 64]))
    assert not caches[0].any() and not caches[1].any()


def test_rotary_refuses_tables_it_would_read_past():
    q, k = torch.randn(2, 6, 64), torch.randn(2, 2, 64)
    half = torch.randn(16, 32)  # [positions, D/2], the inv_freq reading's width
    with pytest.raises(ValueError, match=r"fp32 \[positions, 64\] tables, got \(16, 32\)"):
        cpu_ops.rotary_embedding(torch.tensor([0, 1]), q, k, half, half)
    with pytest.raises(ValueError, match="rotary tables of"):
        cpu_ops.rotary_embedding(torch.tensor([0, 1]), q, k, torch.randn(16, 64), torch.randn(8, 64))


def test_small_ops_refuse_shapes_torch_refuses():
    with pytest.raises(ValueError, match="last dim of 7"):
        cpu_ops.silu_and_mul(torch.randn(4, 7))
    with pytest.raises(ValueError, match="argmax takes fp32"):
        cpu_ops.argmax(torch.randn(2, 0))
    with pytest.raises(ValueError, match="32 weights for rows of 64"):
        cpu_ops.rms_norm(torch.randn(3, 64), torch.ones(32), 1e-5)

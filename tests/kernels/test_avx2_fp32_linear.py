"""Avx2Fp32Linear (avx2_quant_linear.c with fp32 weights) against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_ops
from inferlab.kernels.avx2_fp32_linear import AVX2_FP32_MAX_ROWS, Avx2Fp32Linear
from inferlab.kernels.cpu_linear import PackedEmbedding
from inferlab.kernels.linear_choice import use_engine_linears

pytestmark = pytest.mark.skipif(not cpu_ops.avx2_quant_linear_available(),
                                reason="the AVX2 + FMA kernels are not built on this CPU")


def _layer(n: int, k: int, bias: bool) -> tuple[nn.Linear, Avx2Fp32Linear]:
    torch.manual_seed(n + k)
    linear = nn.Linear(k, n, bias=bias)
    return linear, Avx2Fp32Linear(linear)


@pytest.mark.parametrize("rows", [1, 3, 16, 33, 100])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n", [96, 45])  # 45: a partial last block
def test_matches_float64(rows: int, bias: bool, n: int) -> None:
    linear, layer = _layer(n, 64, bias)
    x = torch.randn(rows, 64)  # [M, K]
    want = x.double() @ linear.weight.detach().double().T  # [M, N]
    if bias:
        want += linear.bias.detach().double()
    got = layer(x).double()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_rows_do_not_change_each_other() -> None:
    _, layer = _layer(40, 128, True)
    x = torch.randn(AVX2_FP32_MAX_ROWS, 128)  # [M, K]
    alone = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
    for rows in range(2, AVX2_FP32_MAX_ROWS + 1):
        assert torch.equal(layer(x[:rows]), alone[:rows])


def test_holds_only_the_packed_weight() -> None:
    linear, layer = _layer(45, 64, True)
    assert [name for name, _ in layer.named_parameters()] == ["bias"]
    assert torch.equal(layer.unpacked_weight(), linear.weight.detach())


def test_a_tied_embedding_reads_the_packed_head() -> None:
    torch.manual_seed(0)
    model, model.model = nn.Module(), nn.Module()
    model.model.embed_tokens = nn.Embedding(100, 64)  # 100: a partial last block of 8
    model.lm_head = nn.Linear(64, 100, bias=False)
    model.lm_head.weight = model.model.embed_tokens.weight
    table = model.lm_head.weight.detach().clone()
    use_engine_linears(model, torch.device("cpu"), torch.float32)
    head, embedding = model.lm_head, model.model.embed_tokens
    assert isinstance(head, Avx2Fp32Linear) and isinstance(embedding, PackedEmbedding)
    assert embedding.packed is head.packed  # the table held once
    ids = torch.tensor([[0, 7, 8, 99], [42, 42, 1, 63]])
    assert torch.equal(embedding(ids), table[ids])
    x = torch.randn(3, 64)
    assert (head(x).double() - x.double() @ table.double().T).abs().max() < 1e-5
    with pytest.raises(IndexError, match="outside the embedding table"):
        embedding(torch.tensor([100]))

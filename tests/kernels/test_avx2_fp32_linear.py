"""Avx2Fp32Linear (avx2_quant_linear.c with fp32 weights) against a float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
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


# every remainder of the kernel's tiles (3 blocks of 8 outputs by 4 rows) and the limit's edges
ROWS = [*range(1, 21), 63, 64, 65, 96, AVX2_FP32_MAX_ROWS - 1, AVX2_FP32_MAX_ROWS, AVX2_FP32_MAX_ROWS + 1]
# 96 and 72: whole groups of 3 blocks; 40 and 56: a last group of 2 and 1; 45: a partial last block
OUTPUTS = [96, 72, 40, 56, 45]


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 33, 100, AVX2_FP32_MAX_ROWS + 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n", OUTPUTS)
def test_matches_float64(rows: int, bias: bool, n: int) -> None:
    linear, layer = _layer(n, 64, bias)
    x = torch.randn(rows, 64)  # [M, K]
    want = F.linear(x.double(), linear.weight.detach().double(),
                    linear.bias.detach().double() if bias else None)  # [M, N]
    got = layer(x).double()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _exact_products(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Normal values rounded to 12 significant bits, so that the product of two is exact in fp32
    and an FMA rounds as an add does; magnitudes spread over 2^-4..2^4, so that sums round."""
    v = torch.randn(shape, generator=gen) * 2.0 ** torch.randint(-4, 5, shape, generator=gen)
    mantissa, exponent = torch.frexp(v)
    return torch.ldexp(torch.round(mantissa * 4096) / 4096, exponent.float())


def _one_chain(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y = ((x_0 w_0 + x_1 w_1) + ...) + bias in fp32, inputs in order: the kernel's sum."""
    acc = torch.zeros(x.shape[0], w.shape[0])  # [M, N]
    for k in range(x.shape[1]):
        acc = acc + x[:, k:k + 1] * w[:, k]
    return acc + bias


@pytest.mark.parametrize("n", OUTPUTS)
def test_each_output_is_one_chain_in_input_order(n: int) -> None:
    """Bit for bit the fp32 sum of one chain, k = 0..K-1, then the bias, for every row of every
    tile: a tile that split a row's sum (two chains, inputs out of order) fails."""
    gen = torch.Generator().manual_seed(n)
    linear = nn.Linear(96, n)
    with torch.no_grad():
        linear.weight.copy_(_exact_products((n, 96), gen))
        linear.bias.copy_(_exact_products((n,), gen))
    layer = Avx2Fp32Linear(linear)
    x = _exact_products((AVX2_FP32_MAX_ROWS, 96), gen)  # [M, K]
    want = _one_chain(x, linear.weight.detach(), linear.bias.detach())  # the order shows in the bits:
    assert not torch.equal(want, _one_chain(x.flip(1), linear.weight.detach().flip(1), linear.bias.detach()))
    for rows in (1, 2, 3, 4, 5, 7, 12, AVX2_FP32_MAX_ROWS):
        assert torch.equal(layer(x[:rows]), want[:rows]), rows


@pytest.mark.parametrize("n", OUTPUTS)
def test_rows_do_not_change_each_other(n: int) -> None:
    """A row gets the bits it gets alone in batches of every tile remainder, at every place in
    its tile, its inputs a slice of wider rows (a row stride past K)."""
    _, layer = _layer(n, 128, True)
    gen = torch.Generator().manual_seed(n)
    most = max(ROWS)
    wide = torch.randn(most, 136, generator=gen) * torch.rand(most, 1, generator=gen) * 8  # [M, K + 8]
    x = wide[:, 8:]  # [M, K], row stride 136
    alone = torch.cat([layer(x[i:i + 1]) for i in range(most)])
    for rows in ROWS:
        got = layer(x[:rows])
        if rows <= AVX2_FP32_MAX_ROWS:
            assert torch.equal(got, alone[:rows]), rows
        else:  # oneDNN's GEMM: its own order
            torch.testing.assert_close(got, alone[:rows], rtol=1e-5, atol=1e-5 * alone.abs().max().item())


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


def _bf16_exact(n: int, k: int, bias: bool) -> nn.Linear:
    """A layer of a bf16 checkpoint run in fp32: every weight a bf16 number."""
    linear, _ = _layer(n, k, bias)
    with torch.no_grad():
        linear.weight.copy_(linear.weight.to(torch.bfloat16).float())
    return linear


@pytest.mark.parametrize("n", [96, 45])
def test_bf16_exact_weights_are_kept_in_bf16_with_the_same_outputs(n: int) -> None:
    """Half the bytes, the same bits as the fp32-stored layer at every path: one row, tiles of
    1 to 4 rows, and past AVX2_FP32_MAX_ROWS (the weight unpacked for oneDNN)."""
    linear = _bf16_exact(n, 64, bias=True)
    wide, narrow = Avx2Fp32Linear(linear), Avx2Fp32Linear(linear)
    assert narrow.narrow_to_bf16() and narrow.packed.dtype == torch.bfloat16
    assert narrow.packed.nbytes * 2 == wide.packed.nbytes
    for rows in [1, 2, 3, 4, 5, 40, AVX2_FP32_MAX_ROWS + 1]:
        x = torch.randn(rows, 64)
        assert torch.equal(narrow(x), wide(x)), rows
    assert torch.equal(narrow.unpacked_weight(), linear.weight.detach())


def test_weights_bf16_cannot_hold_stay_fp32() -> None:
    _, layer = _layer(40, 64, False)
    assert not layer.narrow_to_bf16() and layer.packed.dtype == torch.float32


def test_a_bf16_checkpoint_keeps_its_decoder_in_bf16_and_its_tied_head_in_fp32() -> None:
    """use_engine_linears on an fp32 model whose weights are all bf16 numbers: the decoder's
    linears narrow; the head, which the tied embedding reads rows from, stays fp32."""
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = nn.Embedding(48, 64)
    model.model.proj = _bf16_exact(96, 64, bias=False)
    model.lm_head = nn.Linear(64, 48, bias=False)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight.to(torch.bfloat16).float())
    model.lm_head.weight = model.model.embed_tokens.weight
    use_engine_linears(model, torch.device("cpu"), torch.float32)
    assert model.model.proj.packed.dtype == torch.bfloat16
    assert model.lm_head.packed.dtype == torch.float32
    assert isinstance(model.model.embed_tokens, PackedEmbedding)
    assert model.model.embed_tokens(torch.tensor([3])).dtype == torch.float32


@pytest.mark.parametrize("rows", [1, 16])
def test_a_bound_kernel_call_writes_what_the_layer_returns(rows: int) -> None:
    """What the planner times a linear by: the C forward's kernel call, arguments bound."""
    linear, layer = _layer(72, 64, True)
    x = torch.randn(rows, 64)  # [M, K]
    call, y = cpu_ops.bound_kernel_call(layer.c_desc(), x)
    assert call() == 0
    want = F.linear(x.double(), linear.weight.detach().double(), linear.bias.detach().double())
    assert (y.double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(y, layer(x))
    with pytest.raises(ValueError, match="64"):
        cpu_ops.bound_kernel_call(layer.c_desc(), x.to(torch.bfloat16))

"""The packed bf16 linear: every row is the exact product rounded once, whichever kernel ran."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.cpu_linear import PackedLinear, packed_linear_supported, use_packed_linears

pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), torch.bfloat16),
                                reason="this CPU (or its compiler) has no AVX512-BF16 kernel")


def exact_product(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The product of the bf16 values in fp32: what the kernels round once to bf16."""
    bias = None if linear.bias is None else linear.bias.float()
    return torch.nn.functional.linear(x.float(), linear.weight.float(), bias)


def assert_rounded_once(ours: torch.Tensor, exact: torch.Tensor) -> None:
    # rounding to bf16 moves a value by at most half an ulp (|v| * eps / 2); fp32 sums of up to
    # 1536 products of this size differ by far less than the 1e-5 absolute allowance
    ulp = exact.abs() * torch.finfo(torch.bfloat16).eps
    assert bool(((ours.float() - exact).abs() <= ulp / 2 + 1e-5).all())


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16, 20, 32, 33, 64, 100])
# (in, out); (8192, 320): a thread's weights span several L2-sized chunks; (96, 32): fewer output
# blocks than threads, so the AMX kernel splits the rows
@pytest.mark.parametrize("shape", [(96, 160), (576, 960), (1536, 576), (64, 48), (8192, 320), (96, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_rounds_the_exact_product_once(rows, shape, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(*shape, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, shape[0], dtype=torch.bfloat16)
    ours = PackedLinear(linear)(x)
    assert ours.shape == (rows, shape[1]) and ours.dtype == torch.bfloat16
    assert_rounded_once(ours, exact_product(linear, x))


@pytest.mark.parametrize("rows", [1, 4, 5, 33, 64])  # the AVX512 kernel, then AMX tiles
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_output_is_the_sums_the_bf16_output_rounds(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(576, 960, bias=bias).to(torch.bfloat16)
    layer, x = PackedLinear(linear), torch.randn(rows, 576, dtype=torch.bfloat16)
    sums = layer.forward_fp32(x)
    assert sums.dtype == torch.float32 and sums.shape == (rows, 960)
    assert torch.allclose(sums, exact_product(linear, x), rtol=0, atol=1e-5)
    assert torch.equal(sums.to(torch.bfloat16), layer(x))


def test_a_row_does_not_depend_on_its_neighbours():
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(576, 960).to(torch.bfloat16))
    x = torch.randn(37, 576, dtype=torch.bfloat16)
    few = layer(x[:4])  # the AVX512 kernel (AMX: tiles of 4 rows)
    for i in range(4):
        assert torch.equal(layer(x[i:i + 1])[0], few[i])
    many = layer(x)  # AMX where present: 37 rows = a full block of 32 and a padded one of 5
    assert torch.equal(layer(x[:5]), many[:5]) and torch.equal(layer(x[32:]), many[32:])


@pytest.mark.parametrize("shape, bias", [((576, 960), True), ((576, 2048), False), ((1536, 576), False)])
def test_a_row_gets_the_same_bits_whatever_the_batch_around_it(shape, bias):
    """Without AMX, 1-4 rows (the single-row kernel) and more (the GEMM's register tiles) sum
    each output as one vdpbf16ps chain in k order; with AMX, every row count runs on tiles (of
    as many rows up to 16, in blocks of 32 beyond). Either way a request's hidden states and fp32
    logits do not depend on how many rows share its step. (Two chains, even and odd pairs, in
    the small kernel had made a seeded bf16 request sample differently alone and in a batch; on
    AMX, the single-row AVX512 kernel beside the GEMM's tiles did.)"""
    torch.manual_seed(2)
    layer = PackedLinear(nn.Linear(*shape, bias=bias).to(torch.bfloat16))
    x = torch.randn(200, shape[0], dtype=torch.bfloat16)
    alone_sums, alone = layer.forward_fp32(x[:1])[0], layer(x[:1])[0]
    for rows in (2, 4, 5, 6, 16, 17, 33, 64, 200):
        assert torch.equal(layer.forward_fp32(x[:rows])[0], alone_sums), rows
        assert torch.equal(layer(x[:rows])[0], alone), rows
    # a prompt's rows: each thread starts at its own row block (AMX) and the last is padded
    prompt = layer(x)
    for r in (95, 100, 199):
        assert torch.equal(prompt[r], layer(x[r:r + 1])[0]), r


def test_packs_into_blocks_of_16_outputs_by_input_pairs():
    weight = torch.arange(32 * 64, dtype=torch.float32).reshape(32, 64).to(torch.bfloat16)
    packed = cpu_ops.pack_bf16(weight)  # [N/16, K/2, 16, 2]
    assert packed.shape == (2, 32, 16, 2)
    # block 1, input pair 3, output 5 of the block: row 21, inputs 6 and 7
    assert packed[1, 3, 5].tolist() == weight[21, 6:8].tolist()


def test_strided_and_batched_inputs():
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    layer = PackedLinear(linear)
    wide = torch.randn(2, 40, 128, dtype=torch.bfloat16)  # 80 rows: AMX tiles load 64 in place
    strided = wide[..., :64]  # rows of 64 inside rows of 128
    assert layer(strided).shape == (2, 40, 32)
    assert torch.equal(layer(strided), layer(strided.contiguous()))
    assert_rounded_once(layer(strided), exact_product(linear, strided))


def test_swaps_only_the_shapes_the_kernels_take_and_keeps_tied_weights():
    embed = nn.Embedding(64, 32).to(torch.bfloat16)
    head = nn.Linear(32, 64, bias=False).to(torch.bfloat16)
    head.weight = embed.weight  # tied, as lm_head and embed_tokens
    before = embed.weight.detach().clone()
    model = nn.Sequential(embed, head, nn.Linear(64, 40).to(torch.bfloat16), nn.Linear(8, 16))
    assert use_packed_linears(model) == 1
    assert isinstance(model[1], PackedLinear)
    assert type(model[2]) is nn.Linear  # 40 outputs: not a multiple of 16
    assert type(model[3]) is nn.Linear  # fp32
    assert torch.equal(model[0].weight, before)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    assert_rounded_once(model[1](x), x.float() @ before.float().T)


def test_rejects_a_weight_the_layout_cannot_hold():
    with pytest.raises(ValueError, match="N % 16"):
        cpu_ops.pack_bf16(torch.zeros(40, 64, dtype=torch.bfloat16))


def gate_up_desc(scheme: str) -> tuple[nn.Module, cpu_library.LinearDesc]:
    """A gate_up layer of the embedded model's shape (576 -> 2 x 1536), bf16 (with a bias:
    the up half's lies 1536 further) or quantized."""
    dense = nn.Linear(576, 2 * 1536, bias=scheme == "bf16").to(torch.bfloat16)
    if scheme == "bf16":
        layer = PackedLinear(dense)
    else:
        from inferlab.quant.linear import build_quant_linear
        from inferlab.quant.qparams import quantize_rtn
        from inferlab.quant.scheme import make_scheme
        args = make_scheme(scheme, 64)
        qw = quantize_rtn(dense.weight.detach().float(), args.weights)
        layer = build_quant_linear(qw, args.activations, None, torch.bfloat16)
    return layer, layer.c_desc()


@pytest.mark.skipif(not (cpu_ops.quant_linear_available() and cpu_ops.dynamic_linear_available()),
                    reason="no C linear_forward")
@pytest.mark.parametrize("scheme", ["bf16", "W8A8"])
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33, 64, 65, 100, 300])
def test_the_fused_glu_gives_the_bits_of_the_linear_then_silu_and_mul(scheme, rows):
    """On AMX tiles (bf16 beyond 16 rows, W8A8 beyond 4; decode batches outputs outer, prompts
    rows outer), silu(gate) * up is taken from each block's sums as they leave the tiles; it must
    round as the linear's stored outputs and silu_and_mul do."""
    torch.manual_seed(rows)
    layer, desc = gate_up_desc(scheme)
    x = torch.randn(rows, 576, dtype=torch.bfloat16) * 2
    fused = cpu_ops.glu_forward(x, desc)
    assert fused.shape == (rows, 1536)
    assert torch.equal(fused, cpu_ops.silu_and_mul(cpu_ops.linear_forward(x, desc)))


@pytest.mark.parametrize("rows", [1, 16, 40])
def test_a_bound_kernel_call_writes_what_the_layer_returns(rows):
    """What the planner times a linear by: the C forward's kernel call, arguments bound."""
    torch.manual_seed(rows)
    linear = nn.Linear(576, 960).to(torch.bfloat16)
    layer, x = PackedLinear(linear), torch.randn(rows, 576, dtype=torch.bfloat16)
    call, y = cpu_ops.bound_kernel_call(layer.c_desc(), x)
    assert call() == 0
    assert_rounded_once(y, exact_product(linear, x))
    assert torch.equal(y, layer(x))
    with pytest.raises(ValueError, match="576"):
        cpu_ops.bound_kernel_call(layer.c_desc(), x.float())
    with pytest.raises(ValueError, match="576"):
        cpu_ops.bound_kernel_call(layer.c_desc(), torch.randn(rows, 1152, dtype=torch.bfloat16)[:, ::2])

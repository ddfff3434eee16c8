"""The bf16 decode linear: the C kernel's rows agree with nn.Linear up to fp32 summation order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_ops
from inferlab.kernels.cpu_linear import DecodeLinear, decode_linear_supported, use_decode_linears

pytestmark = pytest.mark.skipif(not decode_linear_supported(torch.device("cpu"), torch.bfloat16),
                                reason="this CPU (or its compiler) has no AVX512-BF16 kernel")


def fp32_reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The exact product of the bf16 values, in fp32 (what both kernels approximate)."""
    bias = None if linear.bias is None else linear.bias.float()
    return torch.nn.functional.linear(x.float(), linear.weight.float(), bias)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 64])
@pytest.mark.parametrize("shape", [(96, 160), (576, 1728), (100, 37)])  # (in, out); 100: K tail
@pytest.mark.parametrize("bias", [False, True])
def test_rounds_the_exact_product_once(rows, shape, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(*shape, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, shape[0], dtype=torch.bfloat16)
    exact = fp32_reference(linear, x)
    expected = nn.Linear.forward(linear, x)  # oneDNN
    ours = DecodeLinear.forward(linear, x)
    # both are the fp32 sum rounded to bf16: within one bf16 ulp of the exact value
    ulp = exact.abs() * torch.finfo(torch.bfloat16).eps
    assert bool(((ours.float() - exact).abs() <= ulp + 1e-6).all())
    assert bool(((ours.float() - expected.float()).abs() <= 2 * ulp + 1e-6).all())


def test_a_row_does_not_depend_on_its_neighbours():
    torch.manual_seed(0)
    linear = nn.Linear(576, 960).to(torch.bfloat16)
    x = torch.randn(4, 576, dtype=torch.bfloat16)
    together = cpu_ops.bf16_gemv(x, linear.weight, linear.bias)
    for i in range(4):
        assert torch.equal(cpu_ops.bf16_gemv(x[i:i + 1], linear.weight, linear.bias)[0], together[i])


def test_strided_rows_and_state_dict_are_kept():
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    state = {k: v.clone() for k, v in linear.state_dict().items()}
    model = nn.Sequential(linear, nn.ReLU(), nn.Linear(8, 4))
    assert use_decode_linears(model) == 1
    assert isinstance(model[0], DecodeLinear) and type(model[2]) is nn.Linear
    assert all(torch.equal(state[k], v) for k, v in model[0].state_dict().items())
    wide = torch.randn(2, 128, dtype=torch.bfloat16)
    x = wide[:, ::2].contiguous()
    torch.testing.assert_close(model[0](wide[:, :64]), nn.Linear.forward(model[0], wide[:, :64]),
                               atol=2e-2, rtol=2e-2)
    assert model[0](x).shape == (2, 32)

"""Pre-packed bf16 linears compute exactly what nn.Linear computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels.cpu_linear import PackedLinear, pack_linears, packed_linear_supported

pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), torch.bfloat16),
                                reason="this CPU has no oneDNN bf16 support")


@pytest.mark.parametrize("rows", [1, 3, 16, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_same_values_as_nn_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 160, bias=bias).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    assert torch.equal(PackedLinear(linear)(x), linear(x))


def test_pack_linears_swaps_only_bf16_linears():
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.ReLU(), nn.Linear(8, 4))
    assert pack_linears(model) == 1
    assert isinstance(model[0], PackedLinear) and type(model[2]) is nn.Linear

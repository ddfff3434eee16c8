"""The fp32 oneDNN linear: every output within fp32 summation error of the exact product."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.kernels.onednn_linear import OneDnnLinear, onednn_linear_supported, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_linear_supported(torch.device("cpu"), torch.float32),
                                reason="this torch has no oneDNN")


def assert_fp32_product(ours: torch.Tensor, linear: nn.Linear, x: torch.Tensor) -> None:
    """Against the product in float64: an fp32 sum of K terms is off by at most about
    K * eps * sum|terms| (the textbook bound); far looser than any real kernel, far tighter than
    a wrong one."""
    bias = None if linear.bias is None else linear.bias.double()
    w = linear.weight.double()
    exact = torch.nn.functional.linear(x.double(), w, bias)
    scale = torch.nn.functional.linear(x.double().abs(), w.abs(),
                                       None if bias is None else bias.abs())
    bound = linear.in_features * torch.finfo(torch.float32).eps * scale
    assert ours.dtype == torch.float32 and ours.shape == exact.shape
    assert bool(((ours.double() - exact).abs() <= bound).all())


@pytest.mark.parametrize("rows", [1, 6, 64, 300])
@pytest.mark.parametrize(("shape", "bias"), [((576, 960), False), ((1536, 576), True), ((40, 24), True)])
def test_each_row_is_the_product_in_fp32(rows, shape, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(*shape, bias=bias)
    x = torch.randn(rows, shape[0])
    with torch.inference_mode():
        assert_fp32_product(OneDnnLinear(linear)(x), linear, x)


def test_batched_and_strided_inputs():
    linear = nn.Linear(32, 48)
    layer = OneDnnLinear(linear)
    strided = torch.randn(2, 40, 64)[..., ::2]  # [2, 40, 32], every other column
    with torch.inference_mode():
        out = layer(strided)
        assert out.shape == (2, 40, 48)
        assert_fp32_product(out.reshape(80, 48), linear, strided.reshape(80, 32))


def test_swaps_the_fp32_linears_and_keeps_tied_weights():
    embed = nn.Embedding(64, 32)
    head = nn.Linear(32, 64, bias=False)
    head.weight = embed.weight  # tied, as lm_head and embed_tokens
    model = nn.Sequential(embed, head, nn.Linear(64, 40), nn.Linear(8, 16).to(torch.bfloat16))
    assert use_onednn_linears(model) == 2
    assert isinstance(model[1], OneDnnLinear) and isinstance(model[2], OneDnnLinear)
    assert type(model[3]) is nn.Linear  # bf16: not this kernel's
    assert model[1].weight is model[0].weight  # still one tensor
    assert [name for name, _ in model.named_parameters()] == [
        "0.weight", "2.weight", "2.bias", "3.weight", "3.bias"]  # the tie is not a second copy

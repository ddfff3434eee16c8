"""W8A8 linears (int8 via _int_mm, fp8 via _scaled_mm) on CPU.

Exact cases: activations and weights built so that per-row quantization loses nothing (each
row's absmax maps to the top code and every entry is a representable code times the scale),
so the result must equal the float matmul. Plus an error bound on random data.
"""

from __future__ import annotations

import pytest
import torch

from inferlab.kernels.scaled_mm import fp8_w8a8_linear, int8_w8a8_linear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import FLOAT, INT, WeightArgs


def quantize_weight_per_channel(w: torch.Tensor, dtype: torch.dtype
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel symmetric weights as inferlab.quant makes them: (codes [N, K], scale [N])."""
    args = WeightArgs(8, INT) if dtype == torch.int8 else WeightArgs(8, FLOAT)
    qw = quantize_rtn(w, args)
    return qw.codes, qw.scale.reshape(-1)


def test_int8_is_exact_when_rows_are_scaled_integer_codes() -> None:
    gen = torch.Generator().manual_seed(0)
    codes_x = torch.randint(-126, 127, (3, 32), generator=gen).float()
    codes_x[:, 0] = 127.0  # each row's absmax is the top code
    codes_w = torch.randint(-126, 127, (16, 32), generator=gen).float()
    codes_w[:, 5] = -127.0
    x_scale = torch.tensor([[0.5], [0.25], [2.0]])  # powers of two: exact in fp32
    w_scale = torch.tensor([2.0 ** -e for e in range(16)])
    x = codes_x * x_scale
    w = codes_w * w_scale[:, None]
    wq, ws = quantize_weight_per_channel(w, torch.int8)
    assert torch.equal(wq.float(), codes_w) and torch.equal(ws, w_scale)
    bias = torch.linspace(-1, 1, 16)
    torch.testing.assert_close(int8_w8a8_linear(x, wq, ws, bias), x @ w.T + bias,
                               atol=0, rtol=1e-6)


def test_fp8_is_exact_when_entries_are_fp8_codes() -> None:
    gen = torch.Generator().manual_seed(1)
    small = torch.tensor([-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0])  # exact in e4m3
    codes_x = small[torch.randint(0, 9, (4, 32), generator=gen)]
    codes_x[:, 3] = 448.0  # absmax maps to scale 1 * row scale
    codes_w = small[torch.randint(0, 9, (16, 32), generator=gen)]
    codes_w[:, 7] = -448.0
    x = codes_x * torch.tensor([[1.0], [0.5], [4.0], [0.125]])
    w = codes_w * 0.25
    wq, ws = quantize_weight_per_channel(w, torch.float8_e4m3fn)
    torch.testing.assert_close(fp8_w8a8_linear(x, wq, ws), x @ w.T, atol=0, rtol=1e-6)


@pytest.mark.parametrize(("dtype", "rel_error"), [(torch.int8, 0.02), (torch.float8_e4m3fn, 0.06)])
def test_random_error_is_within_quantization_noise(dtype: torch.dtype, rel_error: float) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 256, generator=gen).to(torch.bfloat16)  # [2, 5, K]
    w = torch.randn(64, 256, generator=gen) * 0.05
    wq, ws = quantize_weight_per_channel(w, dtype)
    linear = int8_w8a8_linear if dtype == torch.int8 else fp8_w8a8_linear
    out = linear(x, wq, ws)
    assert out.shape == (2, 5, 64) and out.dtype == torch.bfloat16
    exact = x.float() @ w.T
    assert (out.float() - exact).norm() / exact.norm() < rel_error


@pytest.mark.parametrize(("fn", "dtype", "expected"), [
    # x / 0.05 = [20, -60, 10, 600]: the last clamps to 127 (int8) or 448 (fp8);
    # rows [1, 1, 1, 1] and [2, 0, 0, -1] (scale 0.5) sum 97 and -87, or 418 and -408
    (int8_w8a8_linear, torch.int8, [97 * 0.05, -87 * 0.05 * 0.5]),
    (fp8_w8a8_linear, torch.float8_e4m3fn, [418 * 0.05, -408 * 0.05 * 0.5]),
])
def test_a_static_input_scale_quantizes_every_row_with_it_and_clamps(fn, dtype, expected) -> None:
    x = torch.tensor([[1.0, -3.0, 0.5, 30.0], [0.05, 0.0, 0.0, 0.0]])
    weight = torch.tensor([[1, 1, 1, 1], [2, 0, 0, -1]], dtype=torch.float32).to(dtype)
    out = fn(x, weight, torch.tensor([1.0, 0.5]), input_scale=torch.tensor([0.05]))
    torch.testing.assert_close(out[0], torch.tensor(expected), rtol=1e-6, atol=0)
    # the second row's own absmax is 0.05, yet it takes the static scale: codes [1, 0, 0, 0]
    torch.testing.assert_close(out[1], torch.tensor([0.05, 0.1 * 0.5]), rtol=1e-6, atol=0)


def test_rejects_wrong_scale_shape() -> None:
    wq, _ = quantize_weight_per_channel(torch.randn(8, 16), torch.int8)
    with pytest.raises(ValueError, match="one scale per output channel"):
        int8_w8a8_linear(torch.randn(2, 16), wq, torch.ones(4))

"""Triton W4A16 matmul, on CPU through the interpreter, against compressed-tensors.

Weights are packed with compressed-tensors' own pack_to_int32 and dequantized with its own
dequantize, so the layout and the arithmetic both come from the library that writes them.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402

from inferlab.kernels.triton_w4a16 import w4a16_linear  # noqa: E402

# CPU runs the kernel in the interpreter; where a GPU exists it also runs compiled (-m gpu)
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def quantized_weight(n: int, k: int, group: int, asym: bool, seed: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)  # [N, K]
    scale = torch.rand(n, k // group, generator=gen) * 0.02 + 0.001  # [N, K/G]
    zp = torch.randint(-3, 4, (n, k // group), generator=gen, dtype=torch.int8) if asym else None
    return q, scale, zp


def reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None,
              group: int) -> torch.Tensor:
    args = QuantizationArgs(num_bits=4, strategy="group", group_size=group,
                            symmetric=zp is None)
    w = dequantize(q, scale, zp, args=args, dtype=torch.float64)  # [N, K]
    return x.double() @ w.T


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "group", "asym", "dtype"), [
    (1, 128, False, torch.float32),  # decode row, split over K
    (5, 32, True, torch.float16),  # asymmetric, small groups
    (33, 256, False, torch.bfloat16),  # per-channel (one group spans K), several M tiles
])
def test_matches_compressed_tensors_dequantize(m: int, group: int, asym: bool,
                                               dtype: torch.dtype, device: str) -> None:
    n, k = 80, 256  # N not a multiple of the 64/128-wide tiles
    q, scale, zp = quantized_weight(n, k, group, asym)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = w4a16_linear(x.to(device), pack_to_int32(q, 4).to(device), scale.to(dtype).to(device),
                       group, weight_zero_point=None if zp is None else zp.to(device)).cpu()
    assert out.shape == (m, n) and out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    expected = reference(x, q, scale.to(dtype).float(), zp, group)
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max(), rtol=tol)


@pytest.mark.parametrize("split_k", [1, 3])
def test_split_k_and_bias_and_leading_dims(split_k: int) -> None:
    q, scale, _ = quantized_weight(48, 512, 64, asym=False, seed=2)
    x = torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(3))  # [2, 3, K]
    bias = torch.arange(48, dtype=torch.float32)
    out = w4a16_linear(x, pack_to_int32(q, 4), scale, 64, bias, split_k=split_k)
    expected = reference(x.reshape(6, 512), q, scale, None, 64) + bias.double()
    torch.testing.assert_close(out.reshape(6, 48).double(), expected, atol=1e-4, rtol=1e-5)


def test_rejects_group_size_that_does_not_divide_inputs() -> None:
    q, scale, _ = quantized_weight(16, 256, 128, asym=False)
    with pytest.raises(ValueError, match="group size"):
        w4a16_linear(torch.randn(1, 256), pack_to_int32(q, 4), scale, 96)

"""W8A8 matmuls on torch's low-precision GEMMs: int8 via torch._int_mm, fp8 via torch._scaled_mm.

Both quantize the activations per token at run time (dynamic, symmetric), or with one
calibrated per-tensor scale (static), and take weights quantized per output channel offline
(inferlab.quant makes them): out[m, n] = sum_k xq[m, k] wq[n, k] * sx[m] * sw[n].
This is the arithmetic of compressed-tensors' W8A8 (int8), FP8_DYNAMIC and FP8 schemes. Both ops
run on CPU and CUDA; CUDA's int8 GEMM wants more than 16 rows, so small batches are padded.
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
_MIN_INT_MM_ROWS_CUDA = 17


def activation_scale(x: torch.Tensor, qmax: float, static_scale: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """fp32 [M, 1]: each row's absmax / qmax (dynamic), or the one calibrated `static_scale`."""
    if static_scale is not None:
        return static_scale.reshape(1, 1).float().expand(x.shape[0], 1).contiguous()  # _scaled_mm wants it
    return x.abs().amax(dim=-1, keepdim=True).float().clamp_(min=1e-12).div_(qmax)


def quantize_rows_int8(x: torch.Tensor, static_scale: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], fp32 scale [M, 1]) with x ~= q * scale, symmetric; a static
    scale clamps what lies past it to [-128, 127], as vLLM's static int8 quantization does."""
    scale = activation_scale(x, INT8_MAX, static_scale)  # [M, 1]
    low = -INT8_MAX if static_scale is None else -INT8_MAX - 1
    return (x.float() / scale).round_().clamp_(low, INT8_MAX).to(torch.int8), scale


def quantize_rows_fp8(x: torch.Tensor, static_scale: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], fp32 scale [M, 1]): per-row absmax mapped to 448, or a
    static scale past which values clamp to +-448."""
    scale = activation_scale(x, FP8_MAX, static_scale)  # [M, 1]
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _check(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Validate shapes; returns the weight scale as fp32 [1, N]."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} inputs, the weight {k}")
    if weight_scale.numel() != n:
        raise ValueError(f"weight_scale must hold one scale per output channel ({n}), "
                         f"got shape {tuple(weight_scale.shape)}")
    return weight_scale.reshape(1, n).float()


def int8_w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """x [..., K] @ (weight int8 [N, K] * weight_scale [N])^T -> [..., N] in x.dtype; x is
    quantized per token, or with the static `input_scale` [1] when given."""
    w_scale = _check(x, weight, weight_scale)
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    xq, x_scale = quantize_rows_int8(x2, input_scale)  # [M, K], [M, 1]
    if x.is_cuda and m < _MIN_INT_MM_ROWS_CUDA:
        xq = torch.nn.functional.pad(xq, (0, 0, 0, _MIN_INT_MM_ROWS_CUDA - m))
    acc = torch._int_mm(xq, weight.t())[:m]  # [M, N] int32, exact
    out = acc.float() * x_scale * w_scale
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def fp8_w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ (weight float8_e4m3fn [N, K] * weight_scale [N])^T -> [..., N] in x.dtype;
    x is quantized per token, or with the static `input_scale` [1] when given."""
    w_scale = _check(x, weight, weight_scale)
    x2 = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_rows_fp8(x2, input_scale)  # [M, K], [M, 1]
    # Row-wise scaling wants bf16 output on CUDA; the cast to x.dtype follows.
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=w_scale,
                           out_dtype=torch.bfloat16 if x.is_cuda else torch.float32)
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

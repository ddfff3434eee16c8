"""Scales, zero points, codes: the arithmetic every algorithm and every format shares.

A quantized weight is `codes` [N, K] plus `scale` [N, G] (G = 1 per channel, K/group_size per
group) and, when asymmetric, an integer `zero_point` [N, G]; the weight it stands for is
(codes - zero_point) * scale, the formula compressed-tensors and vLLM use. Symmetric int scales
map each group's absolute maximum to the top code (qmax); fp8 maps it to 448.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from inferlab.errors import InferlabError
from inferlab.kernels.scaled_mm import FP8_MAX
from inferlab.quant.scheme import BLOCK, CHANNEL, FLOAT, GROUPED, TENSOR, WeightArgs


@dataclass
class QuantizedWeight:
    codes: torch.Tensor  # int8 [N, K] (int schemes) or float8_e4m3fn [N, K]
    scale: torch.Tensor  # [N, G], in the dtype the checkpoint stores
    zero_point: torch.Tensor | None  # int8 [N, G] when asymmetric
    args: WeightArgs
    input_scale: torch.Tensor | None = None  # fp32 [1]: static activation scale, one per layer

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.scale, self.zero_point).to(dtype)

    def rows(self, start: int, end: int) -> QuantizedWeight:
        """Output channels start:end (a q/k/v or gate/up shard of a fused weight)."""
        zp = None if self.zero_point is None else self.zero_point[start:end]
        return QuantizedWeight(self.codes[start:end], self.scale[start:end], zp, self.args,
                               self.input_scale)


def num_groups(in_features: int, args: WeightArgs, where: str = "weight",
               suggest: bool = True) -> int:
    """Groups per row. A group size that does not divide the inputs is an error which, when
    `suggest` (quantizing, where --group-size sets it), names one that does."""
    if args.strategy not in GROUPED:
        return 1
    if in_features % args.group_size:
        divisors = [g for g in (256, 128, 64, 32, 16) if in_features % g == 0]
        hint = f" (try --group-size {divisors[0]})" if divisors and suggest else ""
        raise InferlabError(f"{where}: group size {args.group_size} does not divide its "
                            f"{in_features} inputs{hint}")
    return in_features // args.group_size


def _grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, K] -> [N, G, K/G] view."""
    return x.reshape(x.shape[0], groups, x.shape[1] // groups)


def compute_qparams(w: torch.Tensor, args: WeightArgs, scale_dtype: torch.dtype = torch.float32,
                    clip: float | torch.Tensor = 1.0, groups: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Min-max scale (and zero point) per row and group of `w` [N, K] -> ([N, G], [N, G] | None).

    `clip` (a float, or [N, G]) shrinks the range first, as AWQ's clipping search does. Scales
    are rounded to `scale_dtype` here, so codes are computed against the scale that is stored.
    """
    if args.strategy in (TENSOR, BLOCK):  # a scale for many rows, held per row as a channel's is
        return _shared_by_rows(w, args, scale_dtype, clip)
    g = num_groups(w.shape[1], args) if groups is None else groups
    wg = _grouped(w.float(), g)  # [N, G, K/G]
    if args.symmetric:
        top = wg.abs().amax(dim=-1) * clip  # [N, G]
        scale = top / (FP8_MAX if args.kind == FLOAT else args.qmax)
        zero_point = None
    else:
        lo = wg.amin(dim=-1).clamp(max=0) * clip  # zero must stay representable
        hi = wg.amax(dim=-1).clamp(min=0) * clip
        scale = (hi - lo) / (args.qmax - args.qmin)
    scale = stored_scale(torch.where(scale > 0, scale, torch.ones_like(scale)), scale_dtype)
    if not args.symmetric:
        zero_point = (args.qmin - lo / scale.float()).round().clamp(args.qmin, args.qmax)
        zero_point = zero_point.to(torch.int8)
    return scale, zero_point


def stored_scale(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive fp32 scales -> `dtype`, rounded up: a scale rounded down puts a range's ends past
    the codes (bf16 scales clipped asymmetric ranges' ends by up to 1.45 steps), and a tiny one
    rounded to nearest can go to 0 in fp16 (FP8 rows of |w| < 1.3e-5: codes of 0 / 0)."""
    stored = scale.to(dtype)
    up = torch.nextafter(stored, torch.full_like(stored, float("inf")))
    return torch.where(stored.float() < scale, up, stored)


def rows_per_scale(args: WeightArgs, n: int, where: str) -> int:
    """Output rows that share each scale: all of them per tensor, a block's, else one."""
    rows = {TENSOR: n, BLOCK: args.block_rows}.get(args.strategy, 1)
    if n % rows:
        raise InferlabError(f"{where}: blocks of {rows} rows do not divide its {n} outputs")
    return rows


def _shared_by_rows(w: torch.Tensor, args: WeightArgs, scale_dtype: torch.dtype,
                    clip: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per tensor, or per block of block_rows x group_size: the scales of those rows' stacked
    groups, repeated for each row -> [N, G]."""
    n, k = w.shape
    rows = rows_per_scale(args, n, "weight")
    groups = num_groups(k, args)
    stacked = w.reshape(n // rows, rows, groups, k // groups).transpose(1, 2).reshape(n // rows, -1)
    per_row = replace(args, strategy=CHANNEL, group_size=None, block_rows=None)
    scale, zero_point = compute_qparams(stacked, per_row, scale_dtype, clip, groups)  # [N/rows, G]
    return (scale.repeat_interleave(rows, dim=0),
            None if zero_point is None else zero_point.repeat_interleave(rows, dim=0))


def _expand(p: torch.Tensor, k: int) -> torch.Tensor:
    """[N, G] -> [N, K], each group's value repeated over its inputs."""
    return p.repeat_interleave(k // p.shape[1], dim=1)


def quantize(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
             args: WeightArgs) -> torch.Tensor:
    """w [N, K] -> codes [N, K]: int8 round-to-nearest and clamp, or fp8 e4m3 rounding."""
    s = _expand(scale.float(), w.shape[1])
    x = w.float() / s
    if args.kind == FLOAT:
        return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if zero_point is not None:
        x = x + _expand(zero_point.float(), w.shape[1])
    return x.round().clamp(args.qmin, args.qmax).to(torch.int8)


def dequantize(codes: torch.Tensor, scale: torch.Tensor,
               zero_point: torch.Tensor | None) -> torch.Tensor:
    """codes [N, K] -> fp32 [N, K] = (codes - zero_point) * scale."""
    k = codes.shape[1]
    x = codes.float()
    if zero_point is not None:
        x = x - _expand(zero_point.float(), k)
    return x * _expand(scale.float(), k)


def fake_quantize(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                  args: WeightArgs) -> torch.Tensor:
    """Round trip w [N, K] through the codes: what the quantized layer will compute with."""
    return dequantize(quantize(w, scale, zero_point, args), scale, zero_point)


def quantize_rtn(w: torch.Tensor, args: WeightArgs, scale_dtype: torch.dtype = torch.float32,
                 where: str = "weight") -> QuantizedWeight:
    """Round-to-nearest with min-max scales: the baseline every other method is measured against."""
    num_groups(w.shape[1], args, where)
    scale, zero_point = compute_qparams(w, args, scale_dtype)
    return QuantizedWeight(quantize(w, scale, zero_point, args), scale, zero_point, args)

"""Fold per-input-channel scales into a producer/consumer pair without changing the float function.

If x = producer(...) feeds y = x W^T, then dividing the producer's output channel k by s_k and
multiplying column k of W by s_k leaves y unchanged. SmoothQuant and AWQ both rely on it; the
producer is an RMSNorm weight [K] or the rows [K, *] (and bias) of a preceding linear.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def fold_scales(scale: torch.Tensor, producer_weight: torch.Tensor,
                consumers: list[torch.Tensor], producer_bias: torch.Tensor | None = None) -> None:
    """In place: producer (norm weight [K], or linear rows [K, *]) / s, consumer columns * s.

    Used by SmoothQuant and AWQ alike; the float function is unchanged.
    """
    s = scale.to(producer_weight.dtype)
    if producer_weight.dim() == 1:
        producer_weight.div_(s)
    else:
        producer_weight.div_(s[:, None])
    if producer_bias is not None:
        producer_bias.div_(s)
    for w in consumers:
        w.mul_(scale.to(w.dtype)[None, :])

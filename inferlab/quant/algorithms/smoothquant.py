"""SmoothQuant: move activation outliers into the weights before W8A8 quantization.

Per input channel k, s_k = max|x_k|^alpha / max|w_k|^(1 - alpha); the op producing x (an RMSNorm's
weight, or the rows of a preceding linear) is divided by s and the weight columns multiplied by
it. The float function is unchanged; activations become flatter (easier to quantize per token)
and weights a little less flat (they are quantized per channel, which copes). The weights are
then quantized with GPTQ, as llm-compressor's W8A8 recipe does, on the Hessian of the smoothed
inputs (S^-1 H S^-1: no second calibration pass).
"""

from __future__ import annotations

import torch

from inferlab.errors import InferlabError


def smoothing_scales(act_absmax: torch.Tensor, weights: list[torch.Tensor],
                     alpha: float) -> torch.Tensor:
    """act_absmax [K], weights [N_i, K] sharing that input -> s [K] (1 where the input was 0)."""
    if not 0 <= alpha <= 1:
        raise InferlabError(f"SmoothQuant alpha must be in [0, 1], got {alpha}")
    w_max = torch.cat(weights).float().abs().amax(dim=0).clamp(min=1e-5)
    a = act_absmax.float()
    s = a.clamp(min=1e-5).pow(alpha) / w_max.pow(1 - alpha)
    return torch.where(a > 0, s, torch.ones_like(s)).clamp(min=1e-5)

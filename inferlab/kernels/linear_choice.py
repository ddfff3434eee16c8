"""Which kernels a model's dense linears run on, chosen once for its device and dtype: the engine
and the planner's measurements (planner/measure.py) take the same ones."""

from __future__ import annotations

import torch
from torch import nn

from inferlab.kernels.avx2_fp32_linear import avx2_fp32_linear_supported, use_avx2_fp32_linears
from inferlab.kernels.cpu_linear import packed_linear_supported, use_packed_linears
from inferlab.kernels.onednn_linear import onednn_linear_supported, use_onednn_linears


def use_engine_linears(model: nn.Module, device: torch.device, dtype: torch.dtype,
                       narrow: bool = True) -> None:
    """In place: bf16 on a CPU with AVX512-BF16, the packed C kernels; fp32 on a CPU, the AVX2
    kernel where built (a tied embedding reading the packed lm_head; the decoder's weights held
    in fewer bytes where exact, unless not `narrow`) and oneDNN's matmul for the rest; elsewhere
    torch's own."""
    if packed_linear_supported(device, dtype):
        use_packed_linears(model)
        return
    if avx2_fp32_linear_supported(device, dtype):
        use_avx2_fp32_linears(model, narrow)
    if onednn_linear_supported(device, dtype):
        use_onednn_linears(model)

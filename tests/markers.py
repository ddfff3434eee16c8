"""Marks several test folders share."""

from __future__ import annotations

import pytest
import torch

from inferlab.kernels import cpu_ops

# bf16's bits stay a row's own only in the C kernels (AVX512-BF16): elsewhere bf16 runs torch's
# matmuls and attention, which promise no batch invariance (fp32, the dtype there, is tested
# for it)
bf16_kernels = pytest.mark.skipif(not cpu_ops.available(torch.zeros(1, dtype=torch.bfloat16))
                                  or not cpu_ops.bf16_linear_available(),
                                  reason="bf16 runs on torch's kernels here, which promise no batch invariance")

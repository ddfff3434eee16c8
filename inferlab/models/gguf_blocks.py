"""Dequantizing a GGUF's Q8_0, Q4_0 and Q4_1 tensors in torch, to the values gguf-py's numpy
code gives (the same fp32 operations: x * d, d * (q - 8), d * q + m).

Why: gguf-py walks a tensor in row groups from Python (array_split, a call per group), 2.4 s of
the embedded model's 2.6-4.3 s load on an AMD EPYC Zen 3; every engine, server and test that
loads it paid that. Other types go to gguf-py.
"""

from __future__ import annotations

import numpy as np
import torch

_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
TYPES = tuple(_BLOCK_BYTES)


def dequantize_blocks(raw: np.ndarray, type_name: str) -> torch.Tensor:
    """raw: the tensor's bytes (any shape, whole blocks of `type_name`) -> fp32 [blocks * 32],
    block after block."""
    blocks = torch.from_numpy(raw.reshape(-1, _BLOCK_BYTES[type_name]).copy())  # [B, bytes]: out of the read-only map
    d = blocks[:, :2].contiguous().view(torch.float16).float()  # [B, 1]
    # in place: one fp32 copy of the weights at a time (a tied embedding's is 113 MB here)
    if type_name == "Q8_0":
        return blocks[:, 2:].view(torch.int8).float().mul_(d).flatten()
    nibbles = blocks[:, -16:]  # [B, 16]: weight j in the low half of byte j, weight 16 + j the high
    q = torch.cat([nibbles & 15, nibbles >> 4], dim=1)  # [B, 32] uint8
    if type_name == "Q4_0":
        return q.to(torch.int8).sub_(8).float().mul_(d).flatten()
    m = blocks[:, 2:4].contiguous().view(torch.float16).float()
    return q.float().mul_(d).add_(m).flatten()

"""Weights as a GGUF holds them: gguf's own Q4_1 / Q8_0 quantizer, then its dequantizer (the
loader's path), for tests of layers that keep such weights as codes."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize


def gguf_file_blocks(weight: torch.Tensor, kind: str) -> tuple[np.ndarray, torch.Tensor]:
    """(the file's bytes [N, K/32 * block bytes], the fp32 weight [N, K] they load as)."""
    qtype = GGMLQuantizationType[kind]
    raw = quantize(weight.detach().float().numpy(), qtype)
    return raw, torch.from_numpy(dequantize(raw, qtype).reshape(weight.shape).copy())


def gguf_blocks(n: int, k: int, kind: str, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """gguf_file_blocks of a random [n, k] weight."""
    generator = torch.Generator().manual_seed(seed)
    return gguf_file_blocks(torch.randn(n, k, generator=generator) * 0.05, kind)

"""The loader's own Q8_0 / Q4_0 / Q4_1 dequantizing gives gguf-py's values bit for bit: on blocks
of random bytes (every scale bit pattern and code) and on the embedded model's tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inferlab.models.gguf import open_gguf
from inferlab.models.gguf_blocks import TYPES, dequantize_blocks

BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def _same_bits(ours: torch.Tensor, theirs: np.ndarray) -> bool:
    return torch.equal(ours.view(torch.int32), torch.from_numpy(np.ascontiguousarray(theirs).reshape(-1).view(np.int32)))


@pytest.mark.parametrize("type_name", TYPES)
def test_random_blocks_dequantize_to_gguf_py_s_bits(type_name: str) -> None:
    raw = np.random.default_rng(0).integers(0, 256, (64, 8 * BLOCK_BYTES[type_name]), dtype=np.uint8)
    with np.errstate(invalid="ignore"):  # inf * 0 in random scales: NaN either way
        theirs = dequantize(raw, GGMLQuantizationType[type_name])  # [64, 256]
    assert _same_bits(dequantize_blocks(raw, type_name), theirs)


def test_the_embedded_model_s_tensors_dequantize_to_gguf_py_s_bits(embedded_gguf: str) -> None:
    kinds = set()
    for tensor in open_gguf(embedded_gguf).checked_tensors():
        if tensor.type_name in TYPES and (tensor.name.startswith("blk.0.") or "embd" in tensor.name):
            raw = tensor.raw()
            theirs = dequantize(raw, GGMLQuantizationType[tensor.type_name])
            assert _same_bits(dequantize_blocks(raw, tensor.type_name), theirs), tensor.name
            kinds.add(tensor.type_name)
    assert kinds == {"Q4_1", "Q8_0"}

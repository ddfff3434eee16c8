"""fp32 weights that a GGUF's Q4_1 or Q8_0 blocks dequantize to (gguf's own quantizer and
dequantizer: the loader's path) held as those codes: block_codes finds the file's own codes and
scales, and Avx2Fp32Linear holding them gives the fp32-held layer's bits on every path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.avx2_fp32_linear import AVX2_FP32_MAX_ROWS, Avx2Fp32Linear
from inferlab.kernels.block_codes import block_codes
from inferlab.kernels.linear_choice import use_engine_linears
from tests.kernels.gguf_values import gguf_blocks

KERNELS = pytest.mark.skipif(not cpu_ops.avx2_quant_linear_available(),
                             reason="the AVX2 + FMA kernels are not built on this CPU")
BUILT = pytest.mark.skipif(cpu_library.library() is None, reason="the C kernels (which find the codes) are not built")
KINDS = [("Q4_1", 4), ("Q4_0", 4), ("Q8_0", 8)]


def file_codes(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ggml's block layouts: Q4_1 20 bytes (d, m fp16; 16 bytes, element j's nibble low in byte j,
    element 16 + j's high), Q4_0 18 (d fp16; the nibbles, the value d (q - 8), so m = -8d), Q8_0
    34 bytes (d fp16; 32 int8)."""
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, {"Q4_1": 20, "Q4_0": 18, "Q8_0": 34}[kind])
    d = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    if kind == "Q8_0":
        return torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(n, -1), d, None
    if kind == "Q4_1":
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    else:
        m = -8 * d
    qs = torch.from_numpy(blocks[..., -16:].astype(np.int16))
    codes = torch.cat([qs & 15, qs >> 4], dim=-1).to(torch.int8)  # [n, G, 32]
    return codes.reshape(n, -1), d, m


@BUILT
@pytest.mark.parametrize(("kind", "bits"), KINDS)
def test_the_codes_found_are_the_file_s(kind: str, bits: int) -> None:
    raw, weight = gguf_blocks(40, 96, kind)
    found = block_codes(weight)
    codes, d, m = file_codes(raw, kind)
    if kind == "Q4_0":  # a block holding q = 0 and 15 with d < 0 reads as Q4_1's 15 - q, -d, 7d
        flipped = (found.scale == -d) & (d < 0)  # [N, G]
        assert flipped.any() and not flipped.all()  # both ways occur in this weight
        codes = torch.where(flipped.repeat_interleave(32, dim=1), 15 - codes, codes)
        d, m = torch.where(flipped, -d, d), torch.where(flipped, 7 * d, m)
    assert found.bits == bits
    assert torch.equal(found.codes, codes) and torch.equal(found.scale, d)
    assert (found.offset is None) == (m is None) and (m is None or torch.equal(found.offset, m))


@BUILT
def test_a_scale_the_rounding_hides_is_found_beside_the_nearest() -> None:
    """A block whose offset dwarfs its scale: 15d + m rounds so that (max - min) / 15 is nearest
    the fp16 beside d."""
    d, m = torch.tensor(8.183717727661133e-05), torch.tensor(46.40625)  # fp16 values
    q = torch.arange(32) % 16
    weight = (d * q + m).reshape(1, 32)
    assert ((weight.max() - weight.min()) / 15).half().float() != d  # the premise
    found = block_codes(weight)
    assert torch.equal(found.scale, d.reshape(1, 1)) and torch.equal(found.codes, q.to(torch.int8).reshape(1, 32))


@BUILT
def test_weights_no_block_codes_give_are_refused() -> None:
    _, weight = gguf_blocks(8, 64, "Q4_1")
    nudged = weight.clone()
    nudged[3, 40] = torch.nextafter(nudged[3, 40], torch.tensor(1.0))  # one weight one ulp off
    assert block_codes(nudged) is None
    assert block_codes(torch.randn(8, 64)) is None
    assert block_codes(weight[:, :48]) is None  # not whole blocks of 32
    constant = block_codes(torch.zeros(8, 64))  # one value a block: d = 0, codes 0 (gguf's)
    assert constant.bits == 4 and not constant.codes.any() and not constant.scale.any()
    for bad in (float("nan"), float("inf")):
        broken = weight.clone()
        broken[5, 7] = bad
        assert block_codes(broken) is None, bad


def _layers(kind: str, n: int, bias: bool) -> tuple[Avx2Fp32Linear, Avx2Fp32Linear, torch.Tensor]:
    """(fp32-held, codes-held) layers of the same GGUF weight [n, 96]."""
    _, weight = gguf_blocks(n, 96, kind, seed=n)
    linear = nn.Linear(96, n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
    wide, narrow = Avx2Fp32Linear(linear), Avx2Fp32Linear(linear)
    assert narrow.narrow_to_codes()
    return wide, narrow, weight


@KERNELS
@pytest.mark.parametrize(("kind", "bits"), KINDS)
@pytest.mark.parametrize("n", [96, 72, 40, 45])
def test_codes_give_the_fp32_layer_s_bits(kind: str, bits: int, n: int) -> None:
    """One row (codes read as they stream), tiles of 1 to 4 rows of widened blocks, a last group
    of 1 or 2 blocks, a partial block (45), and past AVX2_FP32_MAX_ROWS (oneDNN on the
    unpacked weight)."""
    wide, narrow, weight = _layers(kind, n, bias=n != 72)
    assert narrow.code_bits == bits and narrow.packed.dtype == torch.uint8
    torch.manual_seed(1)
    for rows in [*range(1, 10), 13, 64, AVX2_FP32_MAX_ROWS + 1]:
        x = torch.randn(rows, 96)
        assert torch.equal(narrow(x), wide(x)), rows
    assert torch.equal(narrow.unpacked_weight(), weight)


@KERNELS
@pytest.mark.parametrize(("kind", "most"), [("Q4_1", 0.19), ("Q4_0", 0.19), ("Q8_0", 0.29)])
def test_codes_hold_a_fraction_of_the_fp32_bytes(kind: str, most: float) -> None:
    wide, narrow, _ = _layers(kind, 96, bias=False)
    held = sum(t.nbytes for t in (narrow.packed, narrow.scale, narrow.offset) if t is not None)
    assert held <= most * wide.packed.nbytes


@KERNELS
def test_a_gguf_model_keeps_its_linears_as_codes_bf16_or_fp32_where_exact() -> None:
    """use_engine_linears narrows each decoder linear to the fewest bytes that keep its values
    (codes, else bf16, else fp32); the tied head (Q8_0, the embedded model's) to codes only, its
    embedding keeping the fp32 rows."""
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = nn.Embedding(48, 96)
    model.model.q4 = nn.Linear(96, 64, bias=False)
    model.model.bf16 = nn.Linear(96, 64, bias=False)
    model.model.fp32 = nn.Linear(96, 64, bias=False)
    model.lm_head = nn.Linear(96, 48, bias=False)
    with torch.no_grad():
        model.model.q4.weight.copy_(gguf_blocks(64, 96, "Q4_1")[1])
        model.model.bf16.weight.copy_(model.model.bf16.weight.to(torch.bfloat16).float())
        model.model.embed_tokens.weight.copy_(gguf_blocks(48, 96, "Q8_0")[1])
    table = model.model.embed_tokens.weight.detach().clone()
    model.lm_head.weight = model.model.embed_tokens.weight
    use_engine_linears(model, torch.device("cpu"), torch.float32)
    assert model.model.q4.code_bits == 4
    assert model.model.bf16.code_bits == 0 and model.model.bf16.packed.dtype == torch.bfloat16
    assert model.model.fp32.code_bits == 0 and model.model.fp32.packed.dtype == torch.float32
    assert model.lm_head.code_bits == 8 and torch.equal(model.lm_head.unpacked_weight(), table)
    ids = torch.tensor([0, 7, 8, 47])
    assert torch.equal(model.model.embed_tokens(ids), table[ids])


@KERNELS
@pytest.mark.parametrize("wrong_row", [0, 4100])
def test_codes_the_kernel_does_not_decode_to_the_weights_are_not_kept(monkeypatch, wrong_row: int) -> None:
    """The layer keeps codes only where the kernel's own values of them are every weight, checked
    CHECK_ROWS rows at a time (4,160 rows: the second check holds row 4,100)."""
    from inferlab.kernels import avx2_fp32_linear

    raw, weight = gguf_blocks(4160, 64, "Q8_0")
    found = block_codes(weight)
    found.codes[wrong_row, 5] += 1  # codes whose values are one weight off
    monkeypatch.setattr(avx2_fp32_linear, "block_codes", lambda w: found)
    linear = nn.Linear(64, 4160, bias=False)
    linear.weight.data = weight
    assert Avx2Fp32Linear(linear, narrow=True).code_bits == 0
    monkeypatch.setattr(avx2_fp32_linear, "block_codes", block_codes)
    assert Avx2Fp32Linear(linear, narrow=True).code_bits == 8

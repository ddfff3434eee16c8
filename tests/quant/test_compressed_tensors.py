"""The compressed-tensors library reads what we write, and we run what it writes.

The library is the independent reference here: it validates our quantization_config,
decompresses our tensors, compresses a tiny model we then load, and (through transformers)
computes the reference logits.
"""

from __future__ import annotations

import random

import pytest
import torch

from inferlab.models.loader import load_network
from inferlab.quant.checkpoint import quantization_config, tensors_for
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import make_scheme

from .tiny import library_compressed, prefill_logits

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
)

SCHEMES = [("W8A16", 128, False), ("W8A16", 128, True), ("W8A8", 128, False),
           ("W4A16", 32, False), ("W4A16", 64, True), ("FP8_DYNAMIC", 128, False)]


@pytest.mark.parametrize(("name", "group", "asym"), SCHEMES)
def test_library_accepts_our_config(name: str, group: int, asym: bool) -> None:
    from transformers import CompressedTensorsConfig

    scheme = make_scheme(name, group, asym)
    sparsity = {"format": "dense", "sparsity_structure": "2:4", "targets": ["Linear"],
                "ignore": ["lm_head"], "global_sparsity": 0.5}
    ours = quantization_config(scheme, ["lm_head"], sparsity)
    parsed = QuantizationConfig.model_validate(ours)
    theirs = parsed.config_groups["group_0"]
    assert theirs.format == parsed.format == scheme.format
    assert (theirs.weights.num_bits, theirs.weights.type, theirs.weights.symmetric) == (
        scheme.weights.num_bits, scheme.weights.kind, scheme.weights.symmetric)
    assert theirs.weights.strategy == scheme.weights.strategy
    assert (theirs.input_activations is None) == (scheme.activations is None)
    hf = CompressedTensorsConfig(**ours)
    assert hf.quantization_config.ignore == ["lm_head"]
    assert ct.config.SparsityCompressionConfig.load_from_registry("dense", **sparsity).sparsity_structure == "2:4"


@pytest.mark.parametrize(("name", "group", "asym"), SCHEMES)
def test_library_decompresses_our_tensors_to_our_values(name: str, group: int, asym: bool) -> None:
    scheme = make_scheme(name, group, asym)
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(0))  # 40 rows: zp pad
    qw = quantize_rtn(w, scheme.weights)
    their_scheme = QuantizationScheme.model_validate(scheme.to_ct_group(["Linear"]))
    compressor = BaseCompressor.get_value_from_registry(scheme.format)
    theirs = compressor.decompress(tensors_for(qw, scheme.format), their_scheme)["weight"]
    assert torch.equal(theirs.float(), qw.dequantize())


LIBRARY_GROUPS = {
    "w4a16-g32-asym": {"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, strategy="group", group_size=32, symmetric=False))},
    "w8a16-channel": {"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, strategy="channel"))},
    "w8a16-g32": {"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, strategy="group", group_size=32))},
    "W8A8": {"W8A8": ["Linear"]},
    "FP8_DYNAMIC": {"FP8_DYNAMIC": ["Linear"]},
}


def _logits(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0] for s in seqs]


def _our_logits(directory, seqs: list[list[int]]) -> list[torch.Tensor]:
    net, _ = load_network(str(directory), torch.float32)
    return prefill_logits(net, seqs)


@pytest.mark.parametrize("key", sorted(LIBRARY_GROUPS))
def test_library_checkpoint_loads_and_matches_library_logits(key: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    directory = library_compressed(tmp_path, LIBRARY_GROUPS[key])
    rng = random.Random(0)
    seqs = [[rng.randrange(160) for _ in range(n)] for n in (9, 4)]
    ours = _our_logits(directory, seqs)
    dequantized = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    if key in ("W8A8", "FP8_DYNAMIC"):
        # the library's own forward: decompressed weights, activations fake-quantized per token
        reference = _logits(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32), seqs)
        # fp8 rounds activations exactly as we do; int8 scales by absmax/127.5 where vLLM
        # (and we) use absmax/127, which moves some codes by one step
        tol = 1e-4 if key == "FP8_DYNAMIC" else 3e-2
    else:
        reference, tol = _logits(dequantized, seqs), 1e-4
    for got, want in zip(ours, reference, strict=True):
        assert (got - want).abs().max().item() < tol * max(1.0, want.abs().max().item())
